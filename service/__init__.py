"""flashsale: the purchase API, its domain, settings and the ``flashsale`` CLI."""
