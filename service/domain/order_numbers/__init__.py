"""Order numbers: the 26-character format with ISO 7064 check digits, and the two minters
(Redis shards 00-89, MySQL shards 90-99)."""
