"""The schema of a pipeline file's keys besides the ops' parameters: for each dotted key, its type,
the values or range it allows, the default validation fills in, and the prose the reference prints.

This is the one home of those facts: the validators (``source_keys``, ``pipeline_keys``, ``op_keys``
and ``pipeline``) read choices, ranges and defaults from :data:`KEYS`; the typed settings of
:mod:`~dali_bridge.spec.model` take their defaults from it; ``docs/pipeline-reference.md`` is
generated from it (:mod:`~dali_bridge.spec.reference`). The op parameters have their own home, the
op registry (:mod:`dali_bridge.ops`).

Pure data: nothing here reads a file or checks a value.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from ..ops.base import REQUIRED  # the marker of a value with no default, for keys as for op parameters


class Bound(NamedTuple):
    """The most a count may be, and why: a refusal names both."""
    value: int
    why: str


@dataclass(frozen=True)
class Interval:
    """A range of numbers, each end open or closed: ``Interval(0, 1, "[)")`` holds 0 <= x < 1."""
    low: float
    high: float
    ends: str = "[]"

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.ends[0] == "(" else value >= self.low
        below = value < self.high if self.ends[1] == ")" else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f"{self.ends[0]}{self.low:g}, {self.high:g}{self.ends[1]}"


@dataclass(frozen=True)
class Key:
    """One key of a pipeline file: what validation accepts and fills in, and what the reference says.

    ``type`` is how the value is read, and how the reference's type column is written from the
    fields below: ``integer`` (``minimum``, at most ``maximum``; or one of ``choices``), ``number``
    and ``seconds`` (in ``interval``), ``choice`` (one of ``choices``), ``flag`` (true or false),
    ``list`` (of ``choices``, or of the key's own items, at most ``maximum``); any other text is the
    value's shape in words (``path``, ``mapping``), printed as it is. ``words``: values an
    ``integer`` or ``flag`` key takes besides (``auto``, ``shards``).
    """
    name: str                          # dotted, as a file nests it: ``loader.prefetch``
    type: str
    doc: str                           # what the key means: the reference's last column
    default: Any = REQUIRED            # what validation fills in when a file leaves the key out
    choices: tuple[Any, ...] = ()
    words: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: Bound | None = None
    interval: Interval | None = None
    required_for: str = ""             # a source key: the source type that cannot do without it
    shown_default: str = ""            # the reference's default column where the value alone would mislead

    @property
    def path(self) -> tuple[str, ...]:
        """The mappings that hold the key: ``("loader",)`` for ``loader.prefetch``."""
        return tuple(self.name.split(".")[:-1])

    @property
    def leaf(self) -> str:
        """The key's name in the mapping that holds it: ``prefetch`` for ``loader.prefetch``."""
        return self.name.rsplit(".", 1)[-1]


# The keys each source type allows, in the order the unknown-key message lists them.
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "folder": ("type", "root", "extensions", "max_pixels", "max_bytes"),
    "file_list": ("type", "file_list", "root", "extensions", "max_pixels", "max_bytes",
                  "storage_options", "max_requests", "timeout", "redirect_hosts", "cache"),
    "webdataset": ("type", "shards", "image_key", "label_key", "manifest", "max_pixels", "max_bytes",
                   "storage_options", "max_requests", "timeout", "redirect_hosts", "cache"),
    "parquet": ("type", "files", "image_column", "label_column", "max_pixels", "max_bytes",
                "storage_options", "max_requests", "timeout", "redirect_hosts", "cache"),
}

_AT_URL = "shards, Parquet files or a file list's images at a URL"
_IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")  # webdataset members `dali-bridge convert` writes
# The largest encoded image read per sample, as `dali-bridge convert` caps the files it packs: no
# JPEG, PNG or WebP within source.max_pixels needs more in practice.
_MAX_BYTES = 256 << 20

_IDENTITY_KEYS = (
    Key("version", "integer", "the pipeline format version", choices=(1,)),
    Key("name", "string", "shown in logs, tables and errors", default="pipeline", shown_default="the file's name"),
    Key("backend", "choice",
        "`dali` (GPU), `dali-cpu` (DALI, every op on the CPU), `torchvision` (DataLoader fallback); `auto`: `dali` "
        "when DALI imports and a CUDA device is usable, else `torchvision` (the reason is logged)",
        default="auto", choices=("auto", "dali", "dali-cpu", "torchvision")),
)

_SOURCE_PATH_KEYS = (
    Key("source.type", "choice",
        "`folder`: ImageFolder layout, sorted sub-folder names are the classes; `file_list`: a text file of "
        "`path label` lines; `webdataset`: tar shards ([WebDataset](webdataset.md)); `parquet`: Parquet files "
        "such as Hugging Face image datasets ([From your code](from-your-code.md#parquet-and-hugging-face-image-"
        "datasets))",
        choices=tuple(SOURCE_KEYS)),
    Key("source.root", "path",
        "`folder`: the folder of class sub-folders; `file_list`: base of relative paths in the list (default: the "
        "list's folder). Relative paths resolve against the pipeline file's folder",
        default=None, required_for="folder"),
    Key("source.file_list", "path",
        "the list file; blank lines and `#` comments are skipped, the label is the last field",
        default=None, required_for="file_list"),
    Key("source.extensions", "list of strings", "files with other extensions are ignored, counted and reported",
        default=(".jpg", ".jpeg", ".png", ".webp")),
    Key("source.shards", "brace pattern", "e.g. `shards/train-{000000..000127}.tar`",
        default=None, required_for="webdataset"),
    Key("source.image_key", "string or list", "the image member's extension; the first present wins",
        default=_IMAGE_KEYS, shown_default=f"`{';'.join(_IMAGE_KEYS)}`"),
    Key("source.label_key", "string", "the member holding the integer label as text", default="cls"),
    Key("source.manifest", "path", "class names and label mapping written by `dali-bridge convert`",
        default=None, shown_default="`<prefix>.manifest.json` if present"),
    Key("source.files", "path, glob or brace pattern, or a list of them",
        "the Parquet files, in order (each glob sorted); samples are their rows, file by file",
        default=None, required_for="parquet"),
    Key("source.image_column", "string",
        "`parquet`: the encoded images: Hugging Face's `{bytes, path}` image struct or a binary column",
        default="image"),
    Key("source.label_column", "string",
        "`parquet`: the integer labels; class names from the file's Hugging Face `ClassLabel` names when present",
        default="label"),
)

_SOURCE_LIMIT_KEYS = (
    Key("source.storage_options", "mapping",
        f"{_AT_URL}: fsspec's non-secret client settings (credentials come from the environment; "
        "[Object storage](object-storage.md))",
        default=MappingProxyType({})),
    # S3 serves thousands of GETs per second per prefix; 64 in flight per process hides ~20 ms of
    # latency at ~3,000 samples/s and keeps a batch's memory at 64 samples in transit. The most, 16
    # times that, is far past what a batch needs.
    Key("source.max_requests", "integer", f"{_AT_URL}: GETs in flight per process",
        default=64, minimum=1, maximum=Bound(1024, "each request in flight holds a connection and a sample's bytes")),
    Key("source.timeout", "seconds",
        f"{_AT_URL}: the time one sample's read may take, retries included; then it is a sample error",
        default=60.0, interval=Interval(0, 3600, "(]")),
    Key("source.redirect_hosts", "list of strings",
        f"{_AT_URL}: the other hosts (`host`, or `host:port` for one port) a server may redirect a read to; a "
        "redirect to any other host, or to a scheme other than http(s) such as `file://`, is refused at once",
        default=(), shown_default="none: redirects stay on the URL's own host"),
    Key("source.cache", "`{dir: path, max_bytes: size}`",
        "shards, Parquet files or a file list's images at a URL: download each object whole on first touch into a "
        "node-wide cache bounded by `max_bytes` (bytes, or text like `200GB`), least recently used evicted",
        default=None, shown_default="none (ranged reads)"),
    # PIL's Image.MAX_IMAGE_PIXELS (PIL warns above it and refuses above twice it).
    Key("source.max_pixels", "integer",
        "images whose header claims more pixels (height × width) are refused before decoding, as a sample error "
        "that follows `loader.on_error` (PIL's limit; raise it for larger images)",
        default=89_478_485, minimum=1),
    Key("source.max_bytes", "integer",
        "image files (or shard members) larger than this many bytes are refused before they are read, as a "
        "sample error that follows `loader.on_error` (the cap `dali-bridge convert` packs files under)",
        default=_MAX_BYTES, minimum=1, shown_default=f"`{_MAX_BYTES}` (256 MiB)"),
)

_BATCH_KEYS = (
    Key("batch_size", "integer", "samples per batch", minimum=1),
    # The draws key on the seed's low 32 bits (sampling.py).
    Key("seed", "integer",
        "with the epoch, decides the order and every random parameter (the draws use 32 bits, so larger seeds are "
        "refused rather than repeat a smaller one's augmentations)",
        default=0, minimum=0, maximum=Bound(2 ** 32 - 1, "the draws use the seed's low 32 bits, so seed + 2^32 "
                                                         "would draw the same augmentations")),
    Key("decode.device", "choice",
        "`dali` backend only: `mixed` decodes with nvJPEG on the GPU, `cpu` on the CPU (ops still on the GPU)",
        default="mixed", choices=("mixed", "cpu")),
    Key("parity", "choice",
        "how the DALI backends resample: `exact` reproduces torchvision's `F.resize`, `fast` uses DALI's plain "
        "resize ([Equivalence](equivalence.md#parity-exact-or-fast))",
        default="exact", choices=("exact", "fast")),
    # A recipe chains about 10 ops; DALI's graph builder recurses per op.
    Key("ops", "list", "the ops below, in order; the output size must be fixed",
        maximum=Bound(64, "a recipe uses about 10; DALI builds its graph by recursion")),
    # DINO cuts 10 views of each image, iBOT 12; each view is another image per sample.
    Key("views", "mapping",
        "several augmented views of each image ([Self-supervised](self-supervised.md)): named groups, in the order "
        "batches give them; each `NAME: {count, ops, per_view}` cuts `count` views from the sample's one decode "
        "(after the shared `ops`, which then may be left out), each with its own draws, through the group's `ops` "
        "(ending in the group's output size and finish); `per_view` (optional, one mapping per view) sets op "
        "parameters for single views: `{gaussian_blur: {probability: 0.1}}`. Needs `views` in `outputs`",
        default=(), shown_default="none (one image per sample)",
        maximum=Bound(64, "DINO cuts 10 views of each image, iBOT 12; each view is another image per sample")),
    Key("outputs", "list",
        "what each batch tuple holds, in this order: `image`, `label` (int64), `index` (int64, position in the "
        "source listing), `valid` (bool, false for `pad` repeats), `target` (float32 [N, number of classes]: "
        "soft targets, one-hot with `target.label_smoothing` and batch mixing folded in; required with "
        "`mixup`, `cutmix` or `batch_mix`), `views` (instead of `image` with a `views` section: a list of "
        "[N, C, H, W] batches, every view of the first group, then the next group's)",
        default=("image", "label"), choices=("image", "label", "index", "valid", "target", "views")),
    Key("target.label_smoothing", "number",
        "with the `target` output only: targets are `(1 - ε) · one_hot + ε / number of classes` before mixing, "
        "as `CrossEntropyLoss(label_smoothing=ε)` computes them (so leave the loss's own smoothing at 0)",
        default=0.0, interval=Interval(0, 1, "[)")),
)

# ``loader.ray``'s own keys: what its reader accepts and fills in; the reference prints them in
# ``loader.ray``'s row.
RAY_KEYS: tuple[Key, ...] = (
    Key("loader.ray.address", "text",
        "the cluster: `auto` (the one `ray start` made on this node, or `RAY_ADDRESS`), `ray://host:port` (Ray "
        "Client), `host:port` (a head node's GCS), or none: a local cluster on 127.0.0.1 started with the loader "
        "and stopped when it closes; a process already connected to Ray uses its connection",
        default=None, shown_default="none: a local cluster"),
    Key("loader.ray.cpus", "integer",
        "how many of the cluster's CPUs this rank keeps busy: batches running at once, one task of one CPU each; "
        "a local cluster starts with this many; `auto`: on a local cluster this rank's share of the cores (as "
        "`loader.workers: auto`), on a running cluster its CPUs ÷ the world size (the ranks share it)",
        default=None, minimum=1, words=("auto",), shown_default="`auto`"),
    Key("loader.ray.batches_in_flight", "integer",
        "batches submitted to the cluster and not yet taken by this rank's loop: the bound on what this rank "
        "holds in the object store (batches × batch_size × 3 × height × width bytes of uint8) and how far a slow "
        "node may fall behind before the loop waits for it; `auto`: twice `cpus`",
        default=None, minimum=1, words=("auto",),
        maximum=Bound(1024, "each batch in flight holds its uint8 pixels in the object store"),
        shown_default="`auto`"),
)

_LOADER_KEYS = (
    Key("loader.workers", "integer",
        "DALI threads or DataLoader worker processes; `auto`: this rank's share of the cores available "
        "(cores ÷ processes on this node; `dali-bridge show` prints the figure and why); `0` runs torchvision "
        "in the main process",
        default=None, minimum=0, words=("auto",), shown_default="`auto`"),
    Key("loader.prefetch", "integer", "batches prepared ahead", default=2, minimum=1),
    Key("loader.executor", "choice",
        "how the `torchvision` backend runs its workers: DataLoader worker processes, or threads of the "
        "loader's process (nothing pickled, no shared memory, no worker start-up; the same batches); on "
        "`dali-cpu`, how the ops that run in torch after the DALI graph (the policies, colour jitter) run: "
        "in worker processes, or threads; DALI runs its own threads; `ray`: the `torchvision` backend's per-sample "
        "work in Ray tasks on a cluster (`loader.ray`)",
        default="processes", choices=("processes", "threads", "ray")),
    Key("loader.ray", "`{address, cpus, batches_in_flight}`",
        "`executor: ray` only: the `torchvision` backend's per-sample work (read, decode, the ops up to the "
        "finish) runs in Ray tasks on a cluster's CPUs, the finish and the ops after it in this process; the "
        "same batches as local workers ([Ray](ray.md)). " + "; ".join(f"`{key.leaf}`: {key.doc}" for key in RAY_KEYS),
        default=None, shown_default="a local cluster, `cpus` and `batches_in_flight` `auto`"),
    Key("loader.last_batch", "choice",
        "`partial`: every sample once, the last batch may be smaller; `drop`: full batches only; `pad`: full "
        "batches, the shortfall repeated from the epoch's start and marked `valid: false`",
        default="partial", choices=("partial", "drop", "pad")),
    Key("loader.on_error", "choice",
        "at an unreadable sample: stop with its index, file and reason, or leave it out, count and log it "
        "([Errors](errors.md))",
        default="raise", choices=("raise", "skip")),
    Key("loader.shuffle", "flag",
        "`false` keeps the listing order (validation); `shards` (webdataset): shards shuffled, then samples "
        "within a window of shards ([Object storage](object-storage.md#a-shard-aware-order))",
        default=True, words=("shards",)),
    # 16 shards per window: about 16 classes at once when the shards are sorted; the most is far
    # past any dataset's shard count (1,024 for ImageNet).
    Key("loader.shuffle_window", "integer",
        "`shuffle: shards`: how many shards' samples are shuffled together; `dali-bridge show --order` "
        "measures how well a window mixes classes",
        default=16, minimum=1, maximum=Bound(1_000_000, "a window of every shard is a global shuffle")),
    # DeiT and torchvision's RASampler use 3; each repeat is one more epoch pass.
    Key("loader.repeated_augmentations", "integer",
        "each sample comes this many times per epoch, each time with its own random parameters; the repeats "
        "follow one another in the epoch's order before it is dealt to ranks (torchvision's `RASampler`), so "
        "they land on different ranks; `len()` and every `last_batch` policy count `samples × r`",
        default=1, minimum=1, maximum=Bound(32, "recipes repeat each sample 3 times; each repeat is another "
                                                "pass over the data")),
    Key("loader.report_starvation", "flag",
        "log at each epoch's end whether training waited for data (data-bound, a warning, with what to try) or "
        "not (compute-bound); the figures: `loader.stats()` ([The loader](loader.md#is-the-gpu-starving))",
        default=False),
)

# Every key, by dotted name, in the order the reference lists them.
KEYS: dict[str, Key] = {key.name: key for key in (*_IDENTITY_KEYS, *_SOURCE_PATH_KEYS, *_SOURCE_LIMIT_KEYS,
                                                  *_BATCH_KEYS, *_LOADER_KEYS)}


def default_of(name: str) -> Any:
    """The default of the key ``name`` (dotted)."""
    return KEYS[name].default


def section_keys(section: str) -> tuple[str, ...]:
    """The keys of a top-level mapping (``decode``: ``("device",)``), in the schema's order;
    ``""``: the top-level keys themselves."""
    if not section:
        return tuple(dict.fromkeys(name.split(".", 1)[0] for name in KEYS))
    return tuple(key.leaf for key in KEYS.values() if key.path == (section,))
