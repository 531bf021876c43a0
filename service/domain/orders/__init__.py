"""Orders after the purchase: reading them back, the status machine, cancellation, actors."""
