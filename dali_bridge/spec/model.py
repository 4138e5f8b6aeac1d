"""The pipeline file's vocabulary and the typed values a valid file becomes: the choices and bounds
of its keys, and the source, op and loader settings (:class:`~dali_bridge.spec.PipelineSpec`, which
holds them, lives with the entry points that build it).

Pure data: nothing here reads a file or checks a value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

FORMAT_VERSION = 1
BACKENDS = ("auto", "dali", "dali-cpu", "torchvision")
SOURCE_TYPES = ("folder", "file_list", "webdataset", "parquet")
PLANNED_SOURCE_TYPES: tuple[str, ...] = ()
OUTPUTS = ("image", "label", "index", "valid", "target")
LAST_BATCH = ("partial", "drop", "pad")
ON_ERROR = ("raise", "skip")
EXECUTORS = ("processes", "threads")  # how the torchvision backend runs its workers
DECODE_DEVICES = ("mixed", "cpu")
PARITY = ("exact", "fast")
DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
DEFAULT_IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")  # webdataset members `dali-bridge convert` writes
# PIL's Image.MAX_IMAGE_PIXELS (PIL warns above it and refuses above twice it).
DEFAULT_MAX_PIXELS = 89_478_485
# S3 serves thousands of GETs per second per prefix; 64 in flight per process hides ~20 ms of
# latency at ~3,000 samples/s and keeps a batch's memory at 64 samples in transit.
DEFAULT_MAX_REQUESTS = 64
DEFAULT_TIMEOUT = 60.0          # seconds one sample's read may take, retries included
DEFAULT_SHUFFLE_WINDOW = 16  # shards per window of `loader.shuffle: shards` (about 16 classes at once when sorted)

# Upper bounds of counts the spec reads (docs/errors.md lists them with the ops' own), far above
# what a recipe uses and low enough that none can exhaust memory or time by itself.
MAX_OPS = 64                      # a recipe chains about 10; DALI's graph builder recurses per op
MAX_REQUESTS = 1024  # ranged GETs in flight per process: 16 times the default, far past what a batch needs
MAX_SHUFFLE_WINDOW = 1_000_000  # shards per window: far past any dataset's shard count (1,024 for ImageNet)
MAX_REPEATED_AUGMENTATIONS = 32   # DeiT and torchvision's RASampler use 3; each repeat is one more epoch pass
MAX_SEED = 2 ** 32 - 1            # the draws key on the seed's low 32 bits (sampling.py)
# The largest encoded image read per sample (source.max_bytes), as `dali-bridge convert` caps the
# files it packs: no JPEG, PNG or WebP within source.max_pixels needs more in practice.
DEFAULT_MAX_BYTES = 256 << 20


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
    label_key: str = "cls"
    manifest: str | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_bytes: int = DEFAULT_MAX_BYTES
    files: tuple[str, ...] | None = None  # parquet: paths, globs or brace patterns (data/sources/parquet.py)
    image_column: str = "image"
    label_column: str = "label"
    # Shards at a URL (docs/object-storage.md): non-secret client settings, requests in flight per
    # process, seconds one sample's read may take with its retries.
    storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    max_requests: int = DEFAULT_MAX_REQUESTS
    timeout: float = DEFAULT_TIMEOUT
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
class LoaderSpec:
    """Loader settings: ``workers`` None = from the cores available; ``prefetch`` in batches."""
    workers: int | None = None
    prefetch: int = 2
    last_batch: str = "partial"
    on_error: str = "raise"
    shuffle: bool | str = True        # True: a global shuffle; "shards": shards, then samples within a window
    repeated_augmentations: int = 1   # each sample r times per epoch, each repeat with its own draws
    report_starvation: bool = False   # log the data-bound / compute-bound verdict at each epoch's end
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW   # shards whose samples `shuffle: shards` mixes at once
    executor: str = "processes"       # torchvision's workers, dali-cpu's torch tail: processes or threads
