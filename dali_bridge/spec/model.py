"""The pipeline file's vocabulary and the typed values a valid file becomes: the choices and bounds
of its keys under the names the package imports (their values, and every default below, come from
the schema, :data:`~dali_bridge.spec.keys.KEYS`), and the source, op and loader settings
(:class:`~dali_bridge.spec.pipeline.PipelineSpec`, which holds them, lives with the entry points that build it).

Pure data: nothing here reads a file or checks a value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .keys import KEYS, default_of

# The vocabulary by the names the rest of the package imports; the values live in the schema
# (keys.py), with the prose the reference prints.
FORMAT_VERSION: int = KEYS["version"].choices[0]
BACKENDS: tuple[str, ...] = KEYS["backend"].choices
SOURCE_TYPES: tuple[str, ...] = KEYS["source.type"].choices
PLANNED_SOURCE_TYPES: tuple[str, ...] = ()
OUTPUTS: tuple[str, ...] = KEYS["outputs"].choices
LAST_BATCH: tuple[str, ...] = KEYS["loader.last_batch"].choices
ON_ERROR: tuple[str, ...] = KEYS["loader.on_error"].choices
EXECUTORS: tuple[str, ...] = KEYS["loader.executor"].choices  # how the torchvision backend runs its workers
DECODE_DEVICES: tuple[str, ...] = KEYS["decode.device"].choices
PARITY: tuple[str, ...] = KEYS["parity"].choices
DEFAULT_EXTENSIONS: tuple[str, ...] = default_of("source.extensions")
DEFAULT_IMAGE_KEYS: tuple[str, ...] = default_of("source.image_key")
DEFAULT_MAX_PIXELS: int = default_of("source.max_pixels")
DEFAULT_MAX_REQUESTS: int = default_of("source.max_requests")
DEFAULT_TIMEOUT: float = default_of("source.timeout")
DEFAULT_SHUFFLE_WINDOW: int = default_of("loader.shuffle_window")
DEFAULT_MAX_BYTES: int = default_of("source.max_bytes")

# Upper bounds of counts the spec reads (docs/errors.md lists them with the ops' own), far above
# what a recipe uses and low enough that none can exhaust memory or time by itself.
MAX_OPS: int = KEYS["ops"].maximum.value
MAX_REQUESTS: int = KEYS["source.max_requests"].maximum.value
MAX_SHUFFLE_WINDOW: int = KEYS["loader.shuffle_window"].maximum.value
MAX_REPEATED_AUGMENTATIONS: int = KEYS["loader.repeated_augmentations"].maximum.value
MAX_SEED: int = KEYS["seed"].maximum.value
MAX_VIEWS: int = KEYS["views"].maximum.value


@dataclass(frozen=True)
class SourceSpec:
    """Where samples come from. ``root``/``file_list``/``shards``/``manifest`` are absolute once resolved.

    webdataset: ``shards`` a brace pattern (``data/train-{000000..000127}.tar``); ``image_keys``
    the image member extensions, first present wins (default jpg, jpeg, png, webp); ``label_key``
    the label member (default ``cls``, an integer as text); ``manifest`` the converter's JSON for
    class names (default: ``<prefix>.manifest.json`` next to the shards when it exists).

    ``max_pixels`` (any source type): the largest stored width × height of an image, read from its
    header before decoding; a larger one is a sample error naming its size (``loader.on_error``
    decides: raise or skip), on every backend. Default 89,478,485, PIL's ``Image.MAX_IMAGE_PIXELS``
    (a 9459×9459 image, ~268 MB decoded as RGB): a file of a few hundred bytes can claim 30000×30000
    pixels and have a decoder allocate gigabytes.

    ``max_bytes`` (any source type): the largest encoded image file (or shard member) read, checked
    from its size before reading; a larger one is a sample error naming its size. Default 256 MiB,
    the cap ``dali-bridge convert`` packs files under: a file swapped for a 3 GB one would
    otherwise be read whole into every worker that meets it.
    """
    type: str
    root: str | None = None
    file_list: str | None = None
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    shards: str | None = None
    image_keys: tuple[str, ...] = DEFAULT_IMAGE_KEYS
    label_key: str = default_of("source.label_key")
    manifest: str | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_bytes: int = DEFAULT_MAX_BYTES
    files: tuple[str, ...] | None = None  # parquet: paths, globs or brace patterns (data/sources/parquet.py)
    image_column: str = default_of("source.image_column")
    label_column: str = default_of("source.label_column")
    # Shards at a URL (docs/object-storage.md): non-secret client settings, requests in flight per
    # process, seconds one sample's read may take with its retries.
    storage_options: Mapping[str, Any] = field(default_factory=lambda: dict(default_of("source.storage_options")),
                                               hash=False)
    max_requests: int = DEFAULT_MAX_REQUESTS
    timeout: float = DEFAULT_TIMEOUT
    redirect_hosts: tuple[str, ...] = ()   # other hosts a server may redirect a read to (answers.py)
    cache_dir: str | None = None        # source.cache.dir: whole shards cached on the node, else ranged reads
    cache_max_bytes: int | None = None  # source.cache.max_bytes


@dataclass(frozen=True)
class OpSpec:
    """One op as declared: its registry name and every parameter (defaults filled in)."""
    name: str
    params: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.params[key]


@dataclass(frozen=True)
class RaySettings:
    """``loader.ray``: the cluster (``address`` None = a local cluster on 127.0.0.1), the CPUs this rank
    keeps busy (None = auto) and the batches it keeps in flight (None = auto: twice the CPUs)."""
    address: str | None = None
    cpus: int | None = None
    batches_in_flight: int | None = None


@dataclass(frozen=True)
class ViewGroupSpec:
    """A group of views (``views.NAME``): ``count`` views, each cut from the sample's one decode by
    the group's own ``ops``, view ``v`` with ``per_view[v]`` (op name → parameters) set over them."""
    name: str
    count: int
    ops: tuple[OpSpec, ...]
    per_view: tuple[Mapping[str, Mapping[str, Any]], ...] = ()

    def view_ops(self, view: int) -> tuple[OpSpec, ...]:
        """The ops of the group's view ``view`` (0 .. count-1): its ``per_view`` parameters set over the group's."""
        changed = self.per_view[view] if view < len(self.per_view) else {}
        return tuple(OpSpec(op.name, {**op.params, **changed.get(op.name, {})}) for op in self.ops)


@dataclass(frozen=True)
class LoaderSpec:
    """Loader settings: ``workers`` None = from the cores available; ``prefetch`` in batches."""
    workers: int | None = default_of("loader.workers")
    prefetch: int = default_of("loader.prefetch")
    last_batch: str = default_of("loader.last_batch")
    on_error: str = default_of("loader.on_error")
    shuffle: bool | str = default_of("loader.shuffle")  # True: a global shuffle; "shards": shards, then a window
    repeated_augmentations: int = default_of("loader.repeated_augmentations")  # each sample r times per epoch
    report_starvation: bool = default_of("loader.report_starvation")  # log data- or compute-bound per epoch
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW   # shards whose samples `shuffle: shards` mixes at once
    executor: str = default_of("loader.executor")  # torchvision's workers, dali-cpu's torch tail: processes or threads
    ray: RaySettings | None = default_of("loader.ray")  # executor: ray's cluster and bounds (None: all auto)
