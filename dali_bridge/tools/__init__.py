"""Tools over the library: ``compare`` two backends (and the one table of bounds it holds them to),
``convert`` a source into WebDataset shards and ``verify`` them (locally or at a URL), ``doctor``."""
