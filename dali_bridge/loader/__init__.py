"""The loader contract every backend shares: ``build_loader`` and :class:`~dali_bridge.loader.loader.Loader`
(``len``, epochs, last batch, ``state_dict``, error policy, ranks), which backend runs (``select``) and
where each stage runs (``placement``), the host's limits, the post-finish stage and step statistics."""
