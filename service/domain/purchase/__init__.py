"""Taking a purchase: request ids, the stock-mode route, the Redis and MySQL paths, sold-out
flags and the per-user limit."""
