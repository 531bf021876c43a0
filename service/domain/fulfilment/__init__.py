"""The authoritative write of queued orders into MySQL, and dead-lettered orders."""
