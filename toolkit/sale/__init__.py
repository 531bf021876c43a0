"""``flashsale sale``: the main job, a whole flash sale end to end on the real services with its invariants checked."""
