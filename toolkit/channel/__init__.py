"""The payment channel simulator (``flashsale channel serve``): an outside party, so it imports
nothing of the service but its settings (the channels' secrets)."""
