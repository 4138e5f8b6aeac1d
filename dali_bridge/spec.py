"""Pipeline files: YAML → a validated, typed :class:`PipelineSpec`.

Every problem in a file is collected in one pass and reported together, each with
``file:line:column``, the key path (``ops[1].random_resized_crop.scale``), what was expected and
what was found. YAML is data: it is read with ``yaml.safe_load`` (positions come from composing
the same text with the safe loader), so nothing in a pipeline file can execute code.

Pure Python: this layer never imports DALI or torch.
"""
from __future__ import annotations

import copy
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from .formats import DEFAULT_MAX_PIXELS
from .storage import DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT, is_url, secret_option
from .ops import (OPS, REQUIRED, bool_checker, choice_checker, fixed_output_size, is_int, is_number, op_names,
                  size_checker, _type_name)
from .ops.base import _shown
from .quoting import quoted, shortened
from .wording import problem_list

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

def format_path(path: Sequence[Any]) -> str:
    """``("ops", 1, "resize", "size")`` → ``ops[1].resize.size``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            out += ("." if out else "") + (text if len(text) <= 80 else quoted(text))
    return out or "<top level>"


MISSING_SOURCE = "missing source"  # Problem.kind of a source path that does not exist (load_spec check_sources)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (``file:line:col`` or the override), the key path, the message;
    ``kind`` tells apart the problems a caller may treat otherwise (:data:`MISSING_SOURCE`)."""
    where: str
    path: str
    message: str
    kind: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.where}: {self.path}: {self.message}"


class SpecError(ValueError):
    """A pipeline file (or its overrides) is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[Problem], source: str = "pipeline"):
        self.problems = list(problems)
        self.source = source
        super().__init__(problem_list(source, self.problems))


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
    files: tuple[str, ...] | None = None   # parquet: paths, globs or brace patterns (see dali_bridge.parquet)
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
    executor: str = "processes"       # torchvision backend: DataLoader worker processes, or threads of this one


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline with every default filled in."""
    version: int
    name: str
    backend: str
    source: SourceSpec
    batch_size: int
    seed: int
    decode_device: str
    ops: tuple[OpSpec, ...]
    outputs: tuple[str, ...]
    loader: LoaderSpec
    parity: str = "exact"
    label_smoothing: float = 0.0  # folded into the ``target`` output (``target.label_smoothing``)
    origin: str = field(default="<dict>", compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The resolved spec as plain data (absolute paths), loadable by :func:`spec_from_dict`."""
        source: dict[str, Any] = {"type": self.source.type}
        if self.source.root is not None:
            source["root"] = self.source.root
        if self.source.file_list is not None:
            source["file_list"] = self.source.file_list
        if self.source.type == "webdataset":
            source.update(shards=self.source.shards, image_key=";".join(self.source.image_keys),
                          label_key=self.source.label_key)
            if self.source.manifest is not None:
                source["manifest"] = self.source.manifest
            if is_url(self.source.shards or ""):
                source.update(storage_options=copy.deepcopy(dict(self.source.storage_options)),
                              max_requests=self.source.max_requests, timeout=self.source.timeout)
            if self.source.cache_dir is not None:
                source["cache"] = {"dir": self.source.cache_dir, "max_bytes": self.source.cache_max_bytes}
        elif self.source.type == "parquet":
            source.update(files=list(self.source.files or ()), image_column=self.source.image_column,
                          label_column=self.source.label_column)
        else:
            source["extensions"] = list(self.source.extensions)
        if self.source.max_pixels != DEFAULT_MAX_PIXELS:
            source["max_pixels"] = self.source.max_pixels
        if self.source.max_bytes != DEFAULT_MAX_BYTES:
            source["max_bytes"] = self.source.max_bytes
        return {
            "version": self.version,
            "name": self.name,
            "backend": self.backend,
            "source": source,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "decode": {"device": self.decode_device},
            "parity": self.parity,
            "ops": [{op.name: copy.deepcopy(dict(op.params))} for op in self.ops],
            "outputs": list(self.outputs),
            **({"target": {"label_smoothing": self.label_smoothing}} if "target" in self.outputs else {}),
            "loader": {
                "workers": self.loader.workers,
                "prefetch": self.loader.prefetch,
                "last_batch": self.loader.last_batch,
                "on_error": self.loader.on_error,
                "shuffle": self.loader.shuffle,
                "repeated_augmentations": self.loader.repeated_augmentations,
                **({"report_starvation": True} if self.loader.report_starvation else {}),
                # only where it applies: a dump of any other pipeline reads as before
                **({"shuffle_window": self.loader.shuffle_window} if self.loader.shuffle == "shards" else {}),
                **({"executor": self.loader.executor} if self.loader.executor != "processes" else {}),
            },
        }

    def to_yaml(self) -> str:
        """The resolved spec as YAML; ``load_spec`` of it gives an equal spec."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def replace(self, **overrides: Any) -> "PipelineSpec":
        """A new spec with dotted-path overrides applied and validated (see :func:`apply_overrides`)."""
        return spec_from_dict(self.to_dict(), origin=self.origin, overrides=overrides)

    def to_torchvision(self, *, pil: bool = False, skip_batch_ops: bool = False) -> Any:
        """The equivalent ``transforms.v2.Compose``, for uint8 CHW tensors (``pil``: ``PILToTensor`` after the
        uint8 ops): each op's counterpart; a batch-level op is refused unless ``skip_batch_ops``
        (:func:`dali_bridge.recipes.to_torchvision`, :func:`dali_bridge.recipes.batch_transform`)."""
        from .recipes.to_torchvision import to_torchvision

        return to_torchvision(self, pil=pil, skip_batch_ops=skip_batch_ops)


# --------------------------------------------------------------------------------------------
# Reading YAML within bounds: nesting depth and alias expansion are capped while composing, so
# neither the validator's walks nor its messages can grow beyond a small multiple of the text.

MAX_NESTING = 64            # mappings/lists inside each other; a pipeline file needs about 5
ALIAS_NODE_BUDGET = 10_000  # nodes reached through aliases (*name), counted with repeats


class _LimitError(yaml.MarkedYAMLError):
    """A bound of :class:`_BoundedLoader` was passed (reported like a YAML syntax error)."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting and alias expansion beyond the budgets.

    Every alias adds the number of nodes it stands for (its anchor's nodes, aliases inside
    expanded) to a running count: a "billion laughs" file is refused at its first costly alias
    instead of being walked path by path. An alias inside its own anchor (a recursive value) is
    refused too: no walk of it ends.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}
        self._open_anchors: set[str] = set()

    def _size(self, node: yaml.Node) -> int:
        size = self._sizes.get(id(node))
        if size is None:
            children: list = []
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            size = 1 + sum(self._size(child) for child in children)
            self._sizes[id(node)] = size
        return size

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _LimitError(None, None, f"alias *{event.anchor} refers to its own anchor: a recursive "
                                  f"value cannot be validated; write the value out", event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._alias_nodes += self._size(node)
                if self._alias_nodes > ALIAS_NODE_BUDGET:
                    raise _LimitError(None, None, f"aliases expand to more than {ALIAS_NODE_BUDGET} values "
                                      f"(the budget for *name references); write repeated values out or "
                                      f"alias smaller ones", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise _LimitError(None, None, f"nested more than {MAX_NESTING} levels deep (a pipeline file needs "
                              f"about 5)", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)


def _read_yaml(text: str, filename: str) -> tuple[Any, dict[tuple, str]]:
    """The data of a YAML text and where each key path starts; :class:`SpecError` if unreadable."""
    loader = None
    try:
        loader = _BoundedLoader(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem = getattr(exc, "problem", None) or exc
        message = str(problem) if isinstance(exc, _LimitError) else f"not valid YAML: {problem}"
        raise SpecError([Problem(where, "<yaml>", message)], filename) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _node_positions(root, filename)


def _positions(text: str, filename: str) -> dict[tuple, str]:
    """Where each key path of a YAML text starts; empty when the text cannot be read (within bounds)."""
    try:
        return _read_yaml(text, filename)[1]
    except SpecError:
        return {}


def _node_positions(root: yaml.Node | None, filename: str) -> dict[tuple, str]:
    """Where each key path starts (``file:line:column``), from the composed (bounded) node tree."""
    marks: dict[tuple, str] = {}

    def where(node: yaml.Node) -> str:
        return f"{filename}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def walk(node: yaml.Node, path: tuple) -> None:
        marks.setdefault(path, where(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    child = path + (key_node.value,)
                    marks[child] = where(key_node)
                    walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    if root is not None:
        walk(root, ())
    return marks


class NotUtf8Error(UnicodeError):
    """A text file (pipeline, file list, manifest, index) holds bytes that are not UTF-8."""

    def __init__(self, filename: str, data: bytes, exc: UnicodeDecodeError):
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        self.where = f"{filename}:{line}:{column}"
        self.detail = (f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                       f"save the file as UTF-8")
        super().__init__(f"{self.where}: {self.detail}")


def decode_utf8(data: bytes, filename: str) -> str:
    """``data`` as UTF-8 text; :class:`NotUtf8Error` naming the file, line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8Error(filename, data, exc) from None


def text_problem(value: str) -> str | None:
    """Why a string cannot be written as UTF-8 (a lone surrogate such as ``\\ud800``), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds {quoted(value[exc.start:exc.end])} at character {exc.start + 1}, a lone surrogate "
                f"that is not a Unicode character (an invalid escape?)")
    return None


class _Checker:
    """Collects problems; knows where each key path came from."""

    def __init__(self, filename: str, marks: dict[tuple, str], override_origin: dict[tuple, str]):
        self.filename = filename
        self.marks = marks
        self.override_origin = override_origin
        self.problems: list[Problem] = []

    def where(self, path: tuple) -> str:
        # An override of a prefix replaced what the file had there, so it wins over the file's marks.
        for n in range(len(path), -1, -1):
            if path[:n] in self.override_origin:
                return self.override_origin[path[:n]]
        for n in range(len(path), -1, -1):
            if path[:n] in self.marks:
                return self.marks[path[:n]]
        return self.filename

    def add(self, path: tuple, message: str, kind: str = "") -> None:
        self.problems.append(Problem(self.where(path), format_path(path), shortened(message), kind))

    def unknown_keys(self, mapping: Mapping, allowed: Iterable[str], path: tuple, what: str) -> None:
        allowed = list(allowed)
        for key in mapping:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
                self.add(path + (key,), f"unknown key {quoted(str(key))} in {what} (expected one of: "
                                        f"{', '.join(allowed)}){suggestion}")

    def mapping(self, data: Any, path: tuple, what: str) -> dict | None:
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.add(path, f"expected {what} as a mapping, found {_type_name(data)} {quoted(data)}")
            return None
        return data


def _resolve_path(value: str, base_dir: Path) -> str:
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base_dir / path).resolve())


# --------------------------------------------------------------------------------------------
# Overrides

def parse_override(text: str) -> tuple[str, Any]:
    """``"batch_size=32"`` → ``("batch_size", 32)``; the value is read as YAML (safe_load)."""
    if "=" not in text:
        raise SpecError([Problem(f"--set {text}", text, "expected KEY=VALUE, e.g. batch_size=32")], "overrides")
    key, _, raw = text.partition("=")
    try:
        value = _read_yaml(raw, f"--set {text}")[0] if raw.strip() else None
    except SpecError as exc:
        message = exc.problems[0].message.removeprefix("not valid YAML: ")
        raise SpecError([Problem(f"--set {text}", key.strip(), f"value is not valid YAML: {message}")],
                        "overrides") from None
    return key.strip(), value


class SetFlags(dict):
    """Overrides written as ``KEY=VALUE`` text (``--set`` flags, or a list of such strings): their problems
    name the flag (``--set batch_size=0``); a plain mapping's name the entry (``overrides["batch_size"]=0``)."""


def parse_overrides(texts: Iterable[str]) -> SetFlags:
    """``["batch_size=32", ...]`` → ``SetFlags({"batch_size": 32, ...})`` (see :func:`parse_override`)."""
    return SetFlags(parse_override(text) for text in texts)


def _op_mapping_form(entry: Any) -> Any:
    """``- horizontal_flip`` / ``- resize: 256`` → ``{name: {params}}`` so an override can set one parameter."""
    if isinstance(entry, str):
        return {entry: {}}
    if isinstance(entry, dict) and len(entry) == 1:
        name, params = next(iter(entry.items()))
        if params is None:
            return {name: {}}
        op = OPS.get(name)
        if not isinstance(params, dict) and op is not None and op.primary is not None:
            return {name: {op.primary: params}}
    return entry


def apply_overrides(data: dict, overrides: Mapping[str, Any]) -> tuple[dict, dict[tuple, str], list[Problem]]:
    """Apply dotted-path overrides (``source.root``, ``ops.1.resize.size``) to raw pipeline data.

    A mapping value replaces the mapping at that path whole. Returns the new data, where each
    overridden path came from, and problems for paths that cannot be addressed.
    """
    data = copy.deepcopy(data)
    origin: dict[tuple, str] = {}
    problems: list[Problem] = []
    for dotted, value in overrides.items():
        label = f"--set {dotted}={value!r}" if isinstance(overrides, SetFlags) else f'overrides["{dotted}"]={value!r}'
        parts: list[Any] = [int(p) if p.lstrip("-").isdigit() else p for p in str(dotted).split(".") if p != ""]
        if not parts:
            problems.append(Problem(label, str(dotted), "empty key path"))
            continue
        node: Any = data
        ok = True
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, dict):
                if not isinstance(node.get(part), (dict, list)):
                    node[part] = {}
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and -len(node) <= part < len(node):
                parts[i] = part % len(node)
                if parts[:i] == ["ops"]:  # reaching into an op: its shorthand must not be lost
                    node[part] = _op_mapping_form(node[part])
                node = node[part]
            else:
                problems.append(Problem(label, format_path(parts[: i + 1]),
                                        f"cannot address '{part}' inside {_type_name(node)}"))
                ok = False
                break
        if not ok:
            continue
        last = parts[-1]
        if isinstance(node, dict):
            node[last] = value
        elif isinstance(node, list) and isinstance(last, int) and -len(node) <= last < len(node):
            parts[-1] = last % len(node)
            node[last] = value
        else:
            problems.append(Problem(label, format_path(parts), f"cannot address '{last}' inside {_type_name(node)}"))
            continue
        origin[tuple(parts)] = label
    return data, origin, problems


# --------------------------------------------------------------------------------------------
# Validation

def _check_ops(raw_ops: Any, chk: _Checker) -> list[OpSpec]:
    path: tuple = ("ops",)
    if raw_ops is None:
        chk.add(path, "missing required key 'ops' (expected a list of ops, e.g. - center_crop: 224)")
        return []
    if not isinstance(raw_ops, list):
        chk.add(path, f"expected a list of ops, found {_type_name(raw_ops)} {quoted(raw_ops)}")
        return []
    if len(raw_ops) > MAX_OPS:
        chk.add(path, f"expected at most {MAX_OPS} ops (a recipe uses about 10; DALI builds its graph by "
                      f"recursion), found {len(raw_ops)}")
        return []
    ops: list[OpSpec] = []
    for i, entry in enumerate(raw_ops):
        item_path = path + (i,)
        if isinstance(entry, str):
            name, params = entry, {}
        elif isinstance(entry, dict) and len(entry) == 1:
            name, params = next(iter(entry.items()))
        else:
            chk.add(item_path, "expected an op as '- name: {params}' (one key per list item), "
                               f"found {_type_name(entry)} {quoted(entry)}")
            continue
        if name not in OPS:
            hint = difflib.get_close_matches(str(name), op_names(), n=1, cutoff=0.5)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            chk.add(item_path + (name,) if isinstance(entry, dict) else item_path,
                    f"unknown op {quoted(str(name))} (known ops: {', '.join(op_names())}){suggestion}")
            continue
        op = OPS[name]
        op_path = item_path + (name,)
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            if op.primary is None:
                chk.add(op_path, f"expected the parameters of {quoted(str(name))} as a mapping, "
                                 f"found {_type_name(params)} {quoted(params)}")
                continue
            params = {op.primary: params}
        chk.unknown_keys(params, [p.name for p in op.params], op_path, f"op '{name}'")
        resolved: dict[str, Any] = {}
        for param in op.params:
            if param.name not in params:
                if param.default is REQUIRED:
                    chk.add(op_path, f"missing required parameter '{param.name}' ({param.doc})")
                    continue
                resolved[param.name] = copy.deepcopy(param.default)
                continue
            value, message = param.validate(params[param.name])
            if message:
                chk.add(op_path + (param.name,), message)
            resolved[param.name] = value
        if op.extra_check and all(p.name in resolved for p in op.params):
            for key, message in op.extra_check(resolved):
                chk.add(op_path + (key,), message)
        ops.append(OpSpec(name, resolved))
    return ops


# Where each op kind runs, in the order ops must come: per-sample ops on uint8 images, the finish,
# per-sample ops on the finished float images, batch-level ops (kinds not listed: uint8 ops).
_KIND_STAGE = {"finish": 1, "compound": 1, "after_finish": 2, "batch": 3}


def _check_op_order(ops: list[OpSpec], chk: _Checker, indices: list[int]) -> None:
    """Per-sample uint8 ops, then one finish, then ops after the finish (which need a float finish),
    batch-level ops last and at most one of them."""
    finishing = [n for n, op in enumerate(ops) if OPS[op.name].kind in ("finish", "compound")]
    if len(finishing) > 1:
        chk.add(("ops", indices[finishing[1]]), "only one normalize/crop_mirror_normalize op is allowed")
    batch_ops = [n for n, op in enumerate(ops) if OPS[op.name].kind == "batch"]
    if len(batch_ops) > 1:
        first, second = ops[batch_ops[0]].name, ops[batch_ops[1]].name
        chk.add(("ops", indices[batch_ops[1]]), f"only one batch-level op is allowed, found '{first}' and "
                                                f"'{second}': to pick MixUp or CutMix per batch, use one batch_mix op")
    stages = [_KIND_STAGE.get(OPS[op.name].kind, 0) for op in ops]
    for n in finishing:
        later = next((m for m in range(n + 1, len(ops)) if stages[m] == 0), None)
        if later is not None:
            chk.add(("ops", indices[n]), f"'{ops[n].name}' must come after every op on uint8 images (it converts "
                                         f"dtype and layout); ops[{indices[later]}] '{ops[later].name}' follows it")
    for n, op in enumerate(ops):
        before = next((m for m in range(n) if stages[m] > stages[n]), None)
        if stages[n] == 2 and before is not None:  # a per-sample op after a batch-level one
            chk.add(("ops", indices[n]), f"'{op.name}' must come before ops[{indices[before]}] '{ops[before].name}' "
                                         f"(batch-level ops come last)")
        if stages[n] >= 2:
            finish = next((ops[m] for m in finishing if m < n), None)
            if finish is None or finish.params.get("dtype") == "uint8":
                chk.add(("ops", indices[n]), f"'{op.name}' runs on the normalised float images: put a normalize "
                                             f"(dtype float32 or float16) before it")


def _check_target(chk: _Checker, data: dict, outputs: Any, ops: list[OpSpec]) -> float:
    """The ``target`` section (``label_smoothing``), and batch mixing's need for the ``target`` output."""
    wants_target = isinstance(outputs, list) and "target" in outputs
    mixing = next((n for n, op in enumerate(ops) if getattr(OPS[op.name], "mixes_targets", False)), None)
    if mixing is not None and not wants_target:
        chk.add(("outputs",), f"ops[{mixing}] '{ops[mixing].name}' blends images and their labels, so the int64 "
                              f"'label' no longer describes a mixed image: add 'target' to outputs (float "
                              f"[N, num_classes] soft targets, e.g. outputs: [image, target]) and train on it")
    raw = chk.mapping(data.get("target"), ("target",), "the target settings") or {}
    chk.unknown_keys(raw, ("label_smoothing",), ("target",), "target")
    smoothing = raw.get("label_smoothing", 0.0)
    if not is_number(smoothing) or not 0.0 <= smoothing < 1.0:
        chk.add(("target", "label_smoothing"), f"expected a number in [0, 1), found {_type_name(smoothing)} "
                                               f"{smoothing!r}")
        return 0.0
    if smoothing and not wants_target:
        chk.add(("target", "label_smoothing"), "label smoothing shapes the 'target' output, which outputs does not "
                                               "list: add 'target' to outputs, or remove target.label_smoothing")
    return float(smoothing)


def _check_op_sequence(ops: list[OpSpec], chk: _Checker, indices: list[int]) -> None:
    """Cross-op rules: the order of op kinds (:func:`_check_op_order`); crops fit; the output size is fixed."""
    _check_op_order(ops, chk, indices)
    state: Any = None  # None (input size), ("short", s) or (h, w); "unknown" after an invalid size
    for n, op in enumerate(ops):
        op_path = ("ops", indices[n], op.name)
        key, rule = OPS[op.name].size_param, OPS[op.name].size_rule  # how the op sets the size
        if key is None or (OPS[op.name].param(key).default is None and op.params.get(key) is None):
            continue  # an optional size left out: the size stays
        if key not in op.params or size_checker(op.params[key])[1]:
            state = "unknown"  # already reported by the op's own checks
            continue
        if rule == "output":
            state = fixed_output_size(op[key])
        elif rule == "resize":
            state = ("short", op[key]) if isinstance(op[key], int) else fixed_output_size(op[key])
        else:
            crop = fixed_output_size(op[key])
            if state == "unknown":
                state = crop
                continue
            if state is not None and state[0] == "short" and max(crop) > state[1]:
                chk.add(op_path + (key,), f"crop {list(crop)} is larger than the preceding resize's shorter side "
                                          f"({state[1]} px): images would be padded with zeros")
            elif state is not None and state[0] != "short" and (crop[0] > state[0] or crop[1] > state[1]):
                chk.add(op_path + (key,), f"crop {list(crop)} is larger than the preceding output size "
                                          f"{list(state)} (height, width): images would be padded with zeros")
            state = crop
    if ops and (state is None or state[0] == "short"):
        chk.add(("ops",), "the pipeline's output size is not fixed, so images cannot be batched: end with "
                          "random_resized_crop, center_crop, or resize to [height, width]")


def _check_choice(chk: _Checker, mapping: dict, key: str, path: tuple, choices: tuple, default: Any) -> Any:
    if key not in mapping:
        return default
    value, message = choice_checker(choices)(mapping[key])
    if message:
        chk.add(path + (key,), message)
    return value


def _check_int(chk: _Checker, mapping: dict, key: str, path: tuple, default: Any, minimum: int,
               allow_none: bool = False, maximum: tuple[int, str] | None = None) -> Any:
    """An integer key >= ``minimum``; ``maximum``: (the largest allowed, why) for a bounded count."""
    if key not in mapping:
        if default is REQUIRED:
            chk.add(path or (key,), f"missing required key '{format_path(path + (key,))}' "
                                    f"(expected an integer >= {minimum})")
            return None
        return default
    value = mapping[key]
    if value is None and allow_none:
        return None
    if not is_int(value):
        chk.add(path + (key,), f"expected an integer >= {minimum}{' or null' if allow_none else ''}, "
                               f"found {_type_name(value)} {quoted(value)}")
    elif value < minimum:
        chk.add(path + (key,), f"expected an integer >= {minimum}, found {_shown(value)}")
    elif maximum is not None and value > maximum[0]:
        chk.add(path + (key,), f"expected an integer >= {minimum}, at most {maximum[0]} ({maximum[1]}), "
                               f"found {_shown(value)}")
    return value


def _member_keys(value: Any) -> tuple[str, ...] | None:
    """``"jpg;png"``, ``".JPG"`` or ``["jpg", "png"]`` → ``("jpg", "png")``; None when malformed."""
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    keys = tuple(i.strip().lstrip(".").lower() for i in items)
    return keys if keys and all(keys) else None


def _check_webdataset(chk: _Checker, src: dict, resolved: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The webdataset keys: ``shards`` required (brace pattern), ``image_key``/``label_key``/``manifest``."""
    from .shards import expand_braces

    out: dict[str, Any] = {"shards": resolved.get("shards"), "manifest": resolved.get("manifest")}
    if "shards" not in src:
        chk.add(("source",), "missing required key 'source.shards' (a tar shard pattern such as "
                             "data/train-{000000..000127}.tar)")
    elif out["shards"] is not None:
        try:
            expand_braces(src["shards"])  # the pattern as written, for the message
        except ValueError as exc:
            chk.add(("source", "shards"), str(exc))
    for key, default, what in (("image_key", DEFAULT_IMAGE_KEYS, "an extension or a ';'-separated list like jpg;png"),
                               ("label_key", ("cls",), "one member extension like cls")):
        keys = _member_keys(src.get(key, list(default)))
        if keys is None or (key == "label_key" and len(keys) != 1):
            chk.add(("source", key), f"expected {what}, found {_type_name(src[key])} {quoted(src[key])}")
            keys = default
        out["image_keys" if key == "image_key" else key] = keys if key == "image_key" else keys[0]
    if out["label_key"] in out["image_keys"]:
        chk.add(("source", "label_key"), f"label_key '{out['label_key']}' is also an image key")
    out.update(_check_storage(chk, src, base_dir))
    return out


def _check_parquet(chk: _Checker, src: dict, base_dir: Path) -> dict[str, Any]:
    """The parquet keys: ``files`` required (a path, glob or brace pattern, or a list of them, each
    resolved against ``base_dir``), ``image_column`` and ``label_column`` (column names)."""
    from .shards import expand_braces

    out: dict[str, Any] = {}
    files = src.get("files")
    entries = [files] if isinstance(files, str) else files
    if "files" not in src:
        chk.add(("source",), "missing required key 'source.files' (a Parquet file, a glob such as "
                             "data/train-*.parquet, a brace pattern, or a list of them)")
    elif not (isinstance(entries, list) and entries and all(isinstance(e, str) and e for e in entries)):
        chk.add(("source", "files"), f"expected a path, glob or brace pattern, or a non-empty list of them, found "
                                     f"{_type_name(files)} {quoted(files)}")
    elif any(text_problem(e) for e in entries):
        chk.add(("source", "files"), f"expected paths, the value {next(filter(None, map(text_problem, entries)))}")
    else:
        for entry in entries:
            try:
                expand_braces(entry)
            except ValueError as exc:
                chk.add(("source", "files"), str(exc))
        out["files"] = tuple(_resolve_path(entry, base_dir) for entry in entries)
    for key in ("image_column", "label_column"):
        value = src.get(key, key.split("_")[0])
        if not isinstance(value, str) or not value:
            chk.add(("source", key), f"expected a column name, found {_type_name(value)} {quoted(value)}")
        else:
            out[key] = value
    if out.get("image_column") is not None and out.get("image_column") == out.get("label_column"):
        chk.add(("source", "label_column"), f"label_column '{out['label_column']}' is also the image column")
    return out


def _check_storage(chk: _Checker, src: dict, base_dir: Path) -> dict[str, Any]:
    """``storage_options`` (non-secret client settings), ``max_requests``, ``timeout`` and ``cache`` of URL shards."""
    out: dict[str, Any] = {"max_requests": _check_int(chk, src, "max_requests", ("source",), DEFAULT_MAX_REQUESTS, 1,
                                                      maximum=(MAX_REQUESTS, "each request in flight holds a "
                                                               "connection and a sample's bytes"))}
    timeout = src.get("timeout", DEFAULT_TIMEOUT)
    if not is_number(timeout) or not 0 < timeout <= 3600:
        chk.add(("source", "timeout"), f"expected seconds in (0, 3600], found {quoted(timeout)}")
        timeout = DEFAULT_TIMEOUT
    out["timeout"] = float(timeout)
    options = src.get("storage_options", {})
    if not isinstance(options, dict):
        chk.add(("source", "storage_options"), f"expected a mapping of client settings (fsspec's storage_options), "
                                               f"found {_type_name(options)}")
        options = {}
    for name, value in _flattened(options):
        if secret_option(name):
            # Never echo the value: it may be the credential itself.
            chk.add(("source", "storage_options"), f"'{name}' looks like a credential; credentials come from the "
                                                   f"environment and config files (AWS_* variables, AWS_PROFILE, "
                                                   f"GOOGLE_APPLICATION_CREDENTIALS), never the pipeline file")
        elif not (value is None or isinstance(value, (str, bool, int, float))):
            chk.add(("source", "storage_options"), f"'{name}': expected text, a number, true/false or null")
    out["storage_options"] = options
    out.update(_check_cache(chk, src, base_dir))
    if not is_url(src.get("shards", "") if isinstance(src.get("shards"), str) else ""):
        for key in ("storage_options", "max_requests", "timeout", "cache"):
            if key in src:
                chk.add(("source", key), f"'{key}' applies to shards at a URL (s3://, gs://, http(s)://); "
                                         f"source.shards is a local path")
    return out


def _check_cache(chk: _Checker, src: dict, base_dir: Path) -> dict[str, Any]:
    """``source.cache: {dir: PATH, max_bytes: SIZE}``: whole shards cached on the node."""
    from .shard_cache import parse_size

    if "cache" not in src:
        return {}
    cache = chk.mapping(src["cache"], ("source", "cache"), "the shard cache")
    if cache is None:
        return {}
    chk.unknown_keys(cache, ("dir", "max_bytes"), ("source", "cache"), "source.cache")
    folder, size = cache.get("dir"), parse_size(cache.get("max_bytes"))
    if not isinstance(folder, str) or not folder or text_problem(folder):
        chk.add(("source", "cache", "dir"), f"expected the cache folder's path, found {quoted(folder)}")
        folder = None
    if size is None or size < 1:
        chk.add(("source", "cache", "max_bytes"), f"expected a size in bytes such as 200000000000 or '200GB', "
                                                  f"found {quoted(cache.get('max_bytes'))}")
    return {"cache_dir": _resolve_path(folder, base_dir) if folder else None, "cache_max_bytes": size}


def _flattened(options: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, value) of every leaf of a nested mapping (``client_kwargs.region_name``)."""
    leaves: list[tuple[str, Any]] = []
    for name, value in options.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict):
            leaves.extend(_flattened(value, dotted + "."))
        else:
            leaves.append((dotted, value))
    return leaves


def _check_identity(chk: _Checker, data: dict, origin: str) -> tuple[Any, Any, Any, Any]:
    """``version``, ``name``, ``backend`` and ``parity``."""
    version = data.get("version")
    if "version" not in data:
        chk.add((), f"missing required key 'version' (expected {FORMAT_VERSION})")
    elif version != FORMAT_VERSION or isinstance(version, bool):
        chk.add(("version",), f"expected format version {FORMAT_VERSION}, found {quoted(version)}")

    name = data.get("name", Path(origin).stem if origin != "<dict>" else "pipeline")
    if not isinstance(name, str) or not name:
        chk.add(("name",), f"expected a non-empty string, found {_type_name(name)} {quoted(name)}")
    elif text_problem(name):
        chk.add(("name",), f"expected text, the name {text_problem(name)}")
    backend = _check_choice(chk, data, "backend", (), BACKENDS, "auto")
    parity = _check_choice(chk, data, "parity", (), PARITY, "exact")
    return version, name, backend, parity


def _check_source_type(chk: _Checker, src: dict) -> tuple[Any, tuple[str, ...]]:
    """``source.type`` and the keys that type allows."""
    stype = src.get("type")
    if stype is None:
        chk.add(("source",), f"missing required key 'source.type' (expected one of {', '.join(SOURCE_TYPES)})")
    elif stype in PLANNED_SOURCE_TYPES:
        chk.add(("source", "type"), f"source type '{stype}' is not supported in this version "
                                    f"(supported: {', '.join(SOURCE_TYPES)})")
    elif stype not in SOURCE_TYPES:
        hint = difflib.get_close_matches(str(stype), SOURCE_TYPES, n=1)
        chk.add(("source", "type"), f"expected one of {', '.join(SOURCE_TYPES)}, found {quoted(stype)}"
                                    + (f"; did you mean '{hint[0]}'?" if hint else ""))
    allowed = {"folder": ("type", "root", "extensions", "max_pixels", "max_bytes"),
               "file_list": ("type", "file_list", "root", "extensions", "max_pixels", "max_bytes"),
               "webdataset": ("type", "shards", "image_key", "label_key", "manifest", "max_pixels", "max_bytes",
                              "storage_options", "max_requests", "timeout", "cache"),
               "parquet": ("type", "files", "image_column", "label_column", "max_pixels", "max_bytes"),
               }.get(stype, ("type",))
    if stype in SOURCE_TYPES:
        chk.unknown_keys(src, allowed, ("source",), f"a '{stype}' source")
    return stype, allowed


def _check_source(chk: _Checker, data: dict, base_for: Callable[[tuple], Path], *,
                  check_paths: bool = False) -> SourceSpec:
    """The ``source`` mapping; paths resolved (``base_for`` says against which folder); with
    ``check_paths``, each path that does not exist is a problem at its key."""
    source = SourceSpec(type="folder")
    if "source" not in data:
        chk.add((), "missing required key 'source' (expected e.g. {type: folder, root: path/to/images})")
        return source
    src = chk.mapping(data.get("source"), ("source",), "the source")
    if src is None:
        return source
    stype, allowed = _check_source_type(chk, src)
    resolved: dict[str, Any] = {"type": stype}
    for key in ("root", "file_list", "shards", "manifest"):
        if key in src and key in allowed:
            value = src[key]
            if not isinstance(value, str) or not value:
                chk.add(("source", key), f"expected a path (string), found {_type_name(value)} {quoted(value)}")
            elif text_problem(value):
                chk.add(("source", key), f"expected a path, the value {text_problem(value)}")
            elif is_url(value):
                resolved[key] = value  # an object in storage: not a path against the file's folder
            else:
                resolved[key] = _resolve_path(value, base_for(("source", key)))
    if stype == "folder" and "root" not in src:
        chk.add(("source",), "missing required key 'source.root' (the folder whose sub-folders are the classes)")
    if stype == "file_list" and "file_list" not in src:
        chk.add(("source",), "missing required key 'source.file_list' (a text file of 'path label' lines)")
    typed = _check_webdataset(chk, src, resolved, base_for(("source", "cache"))) if stype == "webdataset" else {}
    if stype == "parquet":
        typed = _check_parquet(chk, src, base_for(("source", "files")))
    if check_paths:
        _check_source_paths(chk, resolved)
    extensions = src.get("extensions", list(DEFAULT_EXTENSIONS))
    if not (isinstance(extensions, list) and extensions and all(isinstance(e, str) and e for e in extensions)):
        chk.add(("source", "extensions"), f"expected a non-empty list of file extensions like ['.jpg'], "
                                          f"found {quoted(extensions)}")
        extensions = list(DEFAULT_EXTENSIONS)
    extensions = tuple(("." + e.lstrip(".")).lower() for e in extensions)
    max_pixels = _check_int(chk, src, "max_pixels", ("source",), DEFAULT_MAX_PIXELS, 1)
    max_bytes = _check_int(chk, src, "max_bytes", ("source",), DEFAULT_MAX_BYTES, 1)
    if stype in SOURCE_TYPES:
        source = SourceSpec(type=stype, root=resolved.get("root"), file_list=resolved.get("file_list"),
                            extensions=extensions, max_pixels=max_pixels, max_bytes=max_bytes, **typed)
    return source


def _check_all_ops(chk: _Checker, data: dict) -> list[OpSpec]:
    """``ops``: each op, then the rules across ops when every op is readable."""
    raw_ops = data.get("ops")
    ops = _check_ops(raw_ops, chk)
    if isinstance(raw_ops, list) and len(ops) == len(raw_ops):  # cross-op rules need every op readable
        _check_op_sequence(ops, chk, list(range(len(ops))))
    if isinstance(raw_ops, list) and not raw_ops:
        chk.add(("ops",), "expected at least one op (the output size must be fixed to batch images)")
    return ops


def _check_outputs(chk: _Checker, data: dict) -> list:
    """``outputs``: a non-empty list of known outputs, each once."""
    outputs = data.get("outputs", ["image", "label"])
    if not (isinstance(outputs, list) and outputs):
        chk.add(("outputs",), f"expected a non-empty list drawn from {', '.join(OUTPUTS)}, found {quoted(outputs)}")
        return ["image", "label"]
    for i, out in enumerate(outputs):
        if out not in OUTPUTS:
            hint = difflib.get_close_matches(str(out), OUTPUTS, n=1)
            chk.add(("outputs", i), f"unknown output {quoted(out)} (expected one of {', '.join(OUTPUTS)})"
                                    + (f"; did you mean '{hint[0]}'?" if hint else ""))
    duplicates = sorted({o for o in outputs if isinstance(o, str) and outputs.count(o) > 1})
    if duplicates:
        chk.add(("outputs",), f"each output may appear once; repeated: {', '.join(map(str, duplicates))}")
    return outputs


def _check_loader(chk: _Checker, data: dict) -> LoaderSpec:
    """The ``loader`` mapping."""
    raw_loader = chk.mapping(data.get("loader"), ("loader",), "the loader settings") or {}
    lp = ("loader",)
    chk.unknown_keys(raw_loader, ("workers", "prefetch", "last_batch", "on_error", "shuffle", "repeated_augmentations",
                                  "report_starvation", "shuffle_window", "executor"), lp, "loader")
    workers = raw_loader.get("workers")
    if workers == "auto":
        workers = None
    else:
        workers = _check_int(chk, raw_loader, "workers", lp, None, 0, allow_none=True)
    shuffle = raw_loader.get("shuffle", True)
    if shuffle != "shards" and bool_checker(shuffle)[1]:
        chk.add(lp + ("shuffle",), f"{bool_checker(shuffle)[1]} (or 'shards' for a webdataset source: shards "
                                   f"shuffled, then samples within a window of shards)")
    report = raw_loader.get("report_starvation", False)
    if bool_checker(report)[1]:
        chk.add(lp + ("report_starvation",), bool_checker(report)[1])
    return LoaderSpec(
        workers=workers,
        prefetch=_check_int(chk, raw_loader, "prefetch", lp, 2, 1),
        last_batch=_check_choice(chk, raw_loader, "last_batch", lp, LAST_BATCH, "partial"),
        on_error=_check_choice(chk, raw_loader, "on_error", lp, ON_ERROR, "raise"),
        shuffle=shuffle,
        repeated_augmentations=_check_int(chk, raw_loader, "repeated_augmentations", lp, 1, 1,
                                          maximum=(MAX_REPEATED_AUGMENTATIONS, "recipes repeat each sample 3 "
                                                   "times; each repeat is another pass over the data")),
        report_starvation=report,
        shuffle_window=_check_int(chk, raw_loader, "shuffle_window", lp, DEFAULT_SHUFFLE_WINDOW, 1,
                                  maximum=(MAX_SHUFFLE_WINDOW, "a window of every shard is a global shuffle")),
        executor=_check_choice(chk, raw_loader, "executor", lp, EXECUTORS, "processes"),
    )


def spec_from_dict(data: Any, *, origin: str = "<dict>", base_dir: str | Path | None = None,
                   overrides: Mapping[str, Any] | None = None, marks: dict[tuple, str] | None = None,
                   check_sources: bool = False) -> PipelineSpec:
    """Validate raw pipeline data (as ``yaml.safe_load`` returns it) into a :class:`PipelineSpec`.

    Relative paths in the data resolve against ``base_dir`` (the YAML file's folder; default the
    current directory); relative paths given in ``overrides`` resolve against the current directory.
    ``check_sources``: a source folder, file list, shard or manifest that does not exist is a
    problem too (what ``dali-bridge validate`` checks unless ``--no-source-check``); off by default,
    so a spec can be built for data mounted later (the loader's listing reports it then).
    Raises :class:`SpecError` listing every problem.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problem = Problem(origin, "<top level>", f"expected a mapping of keys, found {_type_name(data)}")
        raise SpecError([problem], origin)
    data, override_origin, override_problems = apply_overrides(data, overrides or {})
    chk = _Checker(origin, marks or {}, override_origin)
    chk.problems.extend(override_problems)
    top_keys = ("version", "name", "backend", "source", "batch_size", "seed", "decode", "parity", "ops", "outputs",
                "target", "loader")
    chk.unknown_keys(data, top_keys, (), "the pipeline")

    def base_for(path: tuple) -> Path:
        return Path.cwd() if any(path[: n] in override_origin for n in range(1, len(path) + 1)) else base

    version, name, backend, parity = _check_identity(chk, data, origin)
    source = _check_source(chk, data, base_for, check_paths=check_sources)
    batch_size = _check_int(chk, data, "batch_size", (), REQUIRED, 1)
    seed = _check_int(chk, data, "seed", (), 0, 0, maximum=(MAX_SEED, "the draws use the seed's low 32 bits, so "
                                                               "seed + 2^32 would draw the same augmentations"))
    decode = chk.mapping(data.get("decode"), ("decode",), "the decode step") or {}
    chk.unknown_keys(decode, ("device",), ("decode",), "decode")
    decode_device = _check_choice(chk, decode, "device", ("decode",), DECODE_DEVICES, "mixed")
    ops = _check_all_ops(chk, data)
    outputs = _check_outputs(chk, data)
    label_smoothing = _check_target(chk, data, outputs, ops if isinstance(data.get("ops"), list) else [])
    loader = _check_loader(chk, data)
    if loader.shuffle == "shards" and source.type != "webdataset":
        chk.add(("loader", "shuffle"), f"'shards' needs a webdataset source (the order shuffles shards); "
                                       f"this source is a {source.type}: use true for a global shuffle")
    if chk.problems:
        raise SpecError(chk.problems, origin)
    return PipelineSpec(version=version, name=name, backend=backend, source=source, batch_size=batch_size,
                        seed=seed, decode_device=decode_device, ops=tuple(ops), outputs=tuple(outputs),
                        loader=loader, parity=parity, label_smoothing=label_smoothing, origin=origin)


def load_spec(path: str | Path, overrides: Mapping[str, Any] | Iterable[str] | None = None, *,
              check_sources: bool = False) -> PipelineSpec:
    """Read and validate a pipeline file.

    ``overrides`` is a mapping of dotted key paths to values (``{"batch_size": 32}``) or a list of
    ``KEY=VALUE`` strings as given to ``--set``. ``check_sources=True`` makes a source folder, file
    list, shard or manifest that does not exist a problem too, positioned and with a did-you-mean
    (``dali-bridge validate`` does so unless ``--no-source-check``). Raises :class:`SpecError`
    listing every problem (file, line, column, key path, expected and found), or ``FileNotFoundError``.
    """
    path = Path(path)
    try:
        text = decode_utf8(path.read_bytes(), str(path))
    except NotUtf8Error as exc:
        raise SpecError([Problem(exc.where, "<file>", exc.detail)], str(path)) from None
    data = _read_yaml(text, str(path))[0]
    if overrides is not None and not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    return spec_from_dict(data, origin=str(path), base_dir=path.resolve().parent, overrides=overrides,
                          marks=_positions(text, str(path)), check_sources=check_sources)


def coerce_spec(spec_or_path: "PipelineSpec | str | Path | Mapping",
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> PipelineSpec:
    """Accept a spec, a path to a pipeline file, or raw pipeline data; apply overrides."""
    if isinstance(spec_or_path, PipelineSpec):
        if overrides:
            if not isinstance(overrides, Mapping):
                overrides = parse_overrides(overrides)
            return spec_from_dict(spec_or_path.to_dict(), origin=spec_or_path.origin, overrides=overrides)
        return spec_or_path
    if isinstance(spec_or_path, Mapping):
        if overrides is not None and not isinstance(overrides, Mapping):
            overrides = parse_overrides(overrides)
        return spec_from_dict(dict(spec_or_path), overrides=overrides)
    return load_spec(spec_or_path, overrides)


def _check_source_paths(chk: _Checker, paths: Mapping[str, Any]) -> None:
    """A problem at ``source.KEY`` for each resolved source path that does not exist, with a did-you-mean."""
    from .shards import expand_braces

    for key, noun in (("root", "folder"), ("file_list", "file"), ("manifest", "file")):
        value = paths.get(key)
        if value is not None and not Path(value).exists():
            chk.add(("source", key), _missing_path_hint(Path(value), noun), MISSING_SOURCE)
    if paths.get("shards") is None:
        return
    try:
        shards = expand_braces(paths["shards"])
    except ValueError:
        return  # the pattern itself is reported by _check_webdataset
    missing = [shard for shard in shards if not os.path.isfile(shard)]
    if missing:
        chk.add(("source", "shards"), f"{len(missing)} of {len(shards)} shard(s) do not exist; the first: "
                                      f"{_missing_path_hint(Path(missing[0]), 'file')}", MISSING_SOURCE)


def missing_source_warnings(spec: PipelineSpec, path: str | Path,
                            overrides: Mapping[str, Any] | None = None) -> list[str]:
    """The source-path problems of :func:`load_spec` ``check_sources=True`` as warnings, for a file
    validated away from its data (``validate --no-source-check``): the data may be mounted later."""
    marks = _positions(Path(path).read_text(encoding="utf-8"), str(path))
    override_origin = apply_overrides({}, overrides or {})[1]
    chk = _Checker(str(path), marks, override_origin)
    _check_source_paths(chk, {"root": spec.source.root, "file_list": spec.source.file_list,
                              "manifest": spec.source.manifest, "shards": spec.source.shards})
    return [str(problem) for problem in chk.problems]


def _missing_path_hint(missing: Path, noun: str) -> str:
    """``folder /d/imagnet does not exist; did you mean /d/imagenet?``, naming the first missing part."""
    first = missing
    while not first.parent.exists() and first.parent != first:
        first = first.parent
    what = "folder" if first != missing else noun
    text = f"{what} {first} does not exist" + (f" (so neither does {missing})" if first != missing else "")
    siblings = [p.name for p in first.parent.iterdir()] if first.parent.is_dir() else []
    hint = difflib.get_close_matches(first.name, siblings, n=1, cutoff=0.6)
    return text + (f"; did you mean {first.parent / hint[0]}?" if hint else "")
