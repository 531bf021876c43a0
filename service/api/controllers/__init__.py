"""HTTP controllers, one module per domain."""
