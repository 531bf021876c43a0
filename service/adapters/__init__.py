"""Adapters to the stores outside the process: Redis (client, scripts, the typed stores) and RabbitMQ (the broker)."""
