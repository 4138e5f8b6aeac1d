"""WebDataset tar shards: the member scan and positioned reads, the same over ranged GETs, a node's
bounded cache of whole shards, read-ahead into it, and the shard-aware epoch order."""
