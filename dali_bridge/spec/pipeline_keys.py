"""The pipeline's own keys besides ``source`` and ``ops``: ``version``, ``name``, ``backend``, ``parity``,
``outputs``, ``target`` and ``loader``.

The loader keys are a table (:data:`LOADER_KEYS`): a new key is read by one row there into the
:class:`~dali_bridge.spec.model.LoaderSpec` field of its name (which holds its default); what is left
is its line in :meth:`~dali_bridge.spec.PipelineSpec.to_dict` and in the reference page.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable

from ..util.checks import bool_checker, is_number, type_name
from ..ops.registry import OPS
from ..util.quoting import quoted
from ..util.text import text_problem
from .model import (BACKENDS, EXECUTORS, FORMAT_VERSION, LAST_BATCH, MAX_REPEATED_AUGMENTATIONS, MAX_SHUFFLE_WINDOW,
    ON_ERROR, OUTPUTS, PARITY, LoaderSpec, OpSpec)
from .problems import ProblemCollector, check_choice, check_int


def check_identity(chk: ProblemCollector, data: dict, origin: str) -> tuple[Any, Any, Any, Any]:
    """``version``, ``name``, ``backend`` and ``parity``."""
    version = data.get("version")
    if "version" not in data:
        chk.add((), f"missing required key 'version' (expected {FORMAT_VERSION})")
    elif version != FORMAT_VERSION or isinstance(version, bool):
        chk.add(("version",), f"expected format version {FORMAT_VERSION}, found {quoted(version)}")

    name = data.get("name", Path(origin).stem if origin != "<dict>" else "pipeline")
    if not isinstance(name, str) or not name:
        chk.add(("name",), f"expected a non-empty string, found {type_name(name)} {quoted(name)}")
    elif text_problem(name):
        chk.add(("name",), f"expected text, the name {text_problem(name)}")
    backend = check_choice(chk, data, "backend", (), BACKENDS, "auto")
    parity = check_choice(chk, data, "parity", (), PARITY, "exact")
    return version, name, backend, parity


def check_outputs(chk: ProblemCollector, data: dict) -> list:
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


def check_target(chk: ProblemCollector, data: dict, outputs: Any, ops: list[OpSpec]) -> float:
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
        chk.add(("target", "label_smoothing"), f"expected a number in [0, 1), found {type_name(smoothing)} "
                                               f"{smoothing!r}")
        return 0.0
    if smoothing and not wants_target:
        chk.add(("target", "label_smoothing"), "label smoothing shapes the 'target' output, which outputs does not "
                                               "list: add 'target' to outputs, or remove target.label_smoothing")
    return float(smoothing)


# Reads one key of a mapping: (collector, the mapping, its path, the key, the default) → the value.
KeyReader = Callable[[ProblemCollector, dict, tuple, str, Any], Any]


def _integer(minimum: int, maximum: tuple[int, str] | None = None) -> KeyReader:
    """An integer >= ``minimum``; ``maximum``: (the largest allowed, why)."""
    return lambda chk, raw, path, key, default: check_int(chk, raw, key, path, default, minimum, maximum=maximum)


def _choice(choices: tuple[str, ...]) -> KeyReader:
    return lambda chk, raw, path, key, default: check_choice(chk, raw, key, path, choices, default)


def _flag(chk: ProblemCollector, raw: dict, path: tuple, key: str, default: Any) -> Any:
    value = raw.get(key, default)
    problem = bool_checker(value)[1]
    if problem:
        chk.add(path + (key,), problem)
    return value


def _workers(chk: ProblemCollector, raw: dict, path: tuple, key: str, default: Any) -> Any:
    """A count >= 0, or ``auto`` (None: from the cores available)."""
    if raw.get(key) == "auto":
        return None
    return check_int(chk, raw, key, path, default, 0, allow_none=True)


def _shuffle(chk: ProblemCollector, raw: dict, path: tuple, key: str, default: Any) -> Any:
    value = raw.get(key, default)
    problem = bool_checker(value)[1]
    if value != "shards" and problem:
        chk.add(path + (key,), f"{problem} (or 'shards' for a webdataset source: shards shuffled, then samples "
                               f"within a window of shards)")
    return value


# Every loader key, named as its LoaderSpec field (whose default it takes), in the order the
# unknown-key message lists them.
LOADER_KEYS: dict[str, KeyReader] = {
    "workers": _workers,
    "prefetch": _integer(1),
    "last_batch": _choice(LAST_BATCH),
    "on_error": _choice(ON_ERROR),
    "shuffle": _shuffle,
    "repeated_augmentations": _integer(1, maximum=(MAX_REPEATED_AUGMENTATIONS, "recipes repeat each sample 3 "
                                                   "times; each repeat is another pass over the data")),
    "report_starvation": _flag,
    "shuffle_window": _integer(1, maximum=(MAX_SHUFFLE_WINDOW, "a window of every shard is a global shuffle")),
    "executor": _choice(EXECUTORS),
}
_LOADER_DEFAULTS = LoaderSpec()


def check_loader(chk: ProblemCollector, data: dict) -> LoaderSpec:
    """The ``loader`` mapping, key by key through :data:`LOADER_KEYS`."""
    raw = chk.mapping(data.get("loader"), ("loader",), "the loader settings") or {}
    chk.unknown_keys(raw, LOADER_KEYS, ("loader",), "loader")
    return LoaderSpec(**{key: read(chk, raw, ("loader",), key, getattr(_LOADER_DEFAULTS, key))
                         for key, read in LOADER_KEYS.items()})
