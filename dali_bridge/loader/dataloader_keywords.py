"""What to write instead of a DataLoader keyword: ``build_loader`` takes none of them (the pipeline
holds the loader's settings), and says, for each one a PyTorch user guesses, which pipeline key
does its job — or why there is nothing to set."""
from __future__ import annotations

from typing import Any, Callable, Mapping

# DataLoader / DistributedSampler keywords a PyTorch user guesses → the pipeline key that does the job
# (and how their value reads there), or why there is nothing to set.
_DATALOADER_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "num_workers": ("loader.workers", lambda v: v),
    "workers": ("loader.workers", lambda v: v),
    "batch_size": ("batch_size", lambda v: v),
    "shuffle": ("loader.shuffle", lambda v: v),
    "drop_last": ("loader.last_batch", lambda v: "drop" if v else "partial"),
    "last_batch": ("loader.last_batch", lambda v: v),
    "prefetch_factor": ("loader.prefetch", lambda v: v),
    "prefetch": ("loader.prefetch", lambda v: v),
    "on_error": ("loader.on_error", lambda v: v),
    "seed": ("seed", lambda v: v),
}
_DATALOADER_WITHOUT_KEY = {
    "pin_memory": "batches land on the loader's device already (pass device=...; the copy to a GPU is pinned)",
    "persistent_workers": "workers live as long as the loader (loader.close() or a with block stops them)",
    "sampler": "the loader owns the order: loader.shuffle and seed in the pipeline, rank= and world_size= here",
    "batch_sampler": "the loader owns the order: batch_size, loader.last_batch and seed in the pipeline",
    "collate_fn": "batches are tensors in the order of the pipeline's outputs",
    "generator": "every random draw comes from the pipeline's seed",
    "worker_init_fn": "workers draw no randomness of their own (the pipeline's seed decides every draw)",
    "num_replicas": "pass world_size= (it defaults to torch.distributed or torchrun's WORLD_SIZE)",
}


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def unexpected_keywords_message(keywords: Mapping[str, Any]) -> str:
    """What to write instead of each keyword ``build_loader`` does not take."""
    import difflib

    lines, settings = [], {}
    for name, value in keywords.items():
        if name in _DATALOADER_KEYS:
            key, convert = _DATALOADER_KEYS[name]
            settings[key] = _literal(convert(value))
            lines.append(f"'{name}': a pipeline setting; pass overrides={{\"{key}\": {settings[key]}}} "
                         f"(or set {key} in the pipeline file)")
        elif name in _DATALOADER_WITHOUT_KEY:
            lines.append(f"'{name}': nothing to set: {_DATALOADER_WITHOUT_KEY[name]}")
        else:
            known = ["backend", "overrides", "rank", "world_size", "device", *_DATALOADER_KEYS]
            hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            lines.append(f"'{name}': not a keyword of build_loader (it takes backend, overrides, rank, world_size, "
                         f"device){f'; did you mean {hint[0]!r}?' if hint else ''}")
    if len(settings) > 1:
        lines.append("together: overrides={" + ", ".join(f'"{k}": {v}' for k, v in settings.items()) + "}")
    return "build_loader() got unexpected keyword argument(s):\n  " + "\n  ".join(lines)
