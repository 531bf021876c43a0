"""Adapters to the stores outside the process: Redis (keys, scripts, the stock store) and RabbitMQ (the broker)."""
