"""Source listings: a folder, a file list, WebDataset shards or Parquet files → one
:class:`~dali_bridge.data.sources.listing.Listing` (samples, labels, class names, how each sample's
bytes are read and checked); the image formats' structural checks and the shared decoder; the
synthetic sample set."""
