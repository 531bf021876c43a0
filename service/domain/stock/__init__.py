"""Stock: the catalog, stock modes, buckets, realignment and the recovery that runs it."""
