"""The HTTP edge: the Litestar app factory, controllers, JWT auth and problem details."""
