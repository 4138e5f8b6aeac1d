"""Where samples come from: ``storage`` reads byte ranges of objects, ``shards`` reads WebDataset tar
shards (local or remote, cached, read ahead), ``sources`` lists a folder, a file list, shards or Parquet
files into one indexable :class:`~dali_bridge.data.sources.listing.Listing`."""
