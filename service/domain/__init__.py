"""Use cases and domain rules: purchase, order numbers, request ids, the order writer,
realignment, lifecycle, payments, catalog, sold-out flags, errors."""
