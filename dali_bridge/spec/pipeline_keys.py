"""The pipeline's own keys besides ``source`` and ``ops``: ``version``, ``name``, ``backend``, ``parity``,
``outputs``, ``target`` and ``loader``.

Choices, ranges and defaults come from the schema (:data:`~dali_bridge.spec.keys.KEYS`). The loader
keys are a table (:data:`LOADER_KEYS`): a new key is its entry in the schema (which also gives its
line in the reference page) and one row there, read into the
:class:`~dali_bridge.spec.model.LoaderSpec` field of its name; what is left is its line in
:meth:`~dali_bridge.spec.pipeline.PipelineSpec.to_dict`.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Callable

from ..util.checks import bool_checker, is_number, type_name
from ..ops.registry import OPS
from ..util.quoting import quoted
from ..util.text import text_problem
from .keys import KEYS, RAY_KEYS, Key, section_keys
from .model import LoaderSpec, OpSpec, RaySettings
from .problems import ProblemCollector, check_choice, check_int


def check_identity(chk: ProblemCollector, data: dict, origin: str) -> tuple[Any, Any, Any, Any]:
    """``version``, ``name``, ``backend`` and ``parity``."""
    version, (expected,) = data.get("version"), KEYS["version"].choices
    if "version" not in data:
        chk.add((), f"missing required key 'version' (expected {expected})")
    elif version != expected or isinstance(version, bool):
        chk.add(("version",), f"expected format version {expected}, found {quoted(version)}")

    name = data.get("name", Path(origin).stem if origin != "<dict>" else KEYS["name"].default)
    if not isinstance(name, str) or not name:
        chk.add(("name",), f"expected a non-empty string, found {type_name(name)} {quoted(name)}")
    elif text_problem(name):
        chk.add(("name",), f"expected text, the name {text_problem(name)}")
    backend = check_choice(chk, data, KEYS["backend"])
    parity = check_choice(chk, data, KEYS["parity"])
    return version, name, backend, parity


def check_outputs(chk: ProblemCollector, data: dict) -> list:
    """``outputs``: a non-empty list of known outputs, each once."""
    known, default = KEYS["outputs"].choices, list(KEYS["outputs"].default)
    outputs = data.get("outputs", default)
    if not (isinstance(outputs, list) and outputs):
        chk.add(("outputs",), f"expected a non-empty list drawn from {', '.join(known)}, found {quoted(outputs)}")
        return default
    for i, out in enumerate(outputs):
        if out not in known:
            hint = difflib.get_close_matches(str(out), known, n=1)
            chk.add(("outputs", i), f"unknown output {quoted(out)} (expected one of {', '.join(known)})"
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
    chk.unknown_keys(raw, section_keys("target"), ("target",), "target")
    key = KEYS["target.label_smoothing"]
    smoothing = raw.get("label_smoothing", key.default)
    if not is_number(smoothing) or smoothing not in key.interval:
        chk.add(("target", "label_smoothing"), f"expected a number in {key.interval}, found {type_name(smoothing)} "
                                               f"{smoothing!r}")
        return key.default
    if smoothing and not wants_target:
        chk.add(("target", "label_smoothing"), "label smoothing shapes the 'target' output, which outputs does not "
                                               "list: add 'target' to outputs, or remove target.label_smoothing")
    return float(smoothing)


# Reads one key of a mapping: (collector, the mapping, the key's schema entry) → the value.
KeyReader = Callable[[ProblemCollector, dict, Key], Any]


def _flag(chk: ProblemCollector, raw: dict, key: Key) -> Any:
    value = raw.get(key.leaf, key.default)
    problem = bool_checker(value)[1]
    if problem:
        chk.add(key.path + (key.leaf,), problem)
    return value


def _workers(chk: ProblemCollector, raw: dict, key: Key) -> Any:
    """A count >= 0, or ``auto`` (None: from the cores available)."""
    if raw.get(key.leaf) in key.words:
        return None
    return check_int(chk, raw, key, allow_none=True)


def _shuffle(chk: ProblemCollector, raw: dict, key: Key) -> Any:
    value = raw.get(key.leaf, key.default)
    problem = bool_checker(value)[1]
    if value not in key.words and problem:
        chk.add(key.path + (key.leaf,), f"{problem} (or 'shards' for a webdataset source: shards shuffled, then "
                                        f"samples within a window of shards)")
    return value


# What ``loader.ray.address`` accepts besides auto: Ray Client's ``ray://host:port`` or a GCS's ``host:port``.
_RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9.\-]+:[0-9]{1,5}|(ray://)?\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


def _ray(chk: ProblemCollector, raw: dict, key: Key) -> RaySettings | None:
    """``loader.ray: {address, cpus, batches_in_flight}`` (``executor: ray``'s cluster and bounds), read
    through :data:`~dali_bridge.spec.keys.RAY_KEYS`; None when the file leaves it out."""
    path = key.path + (key.leaf,)
    if raw.get(key.leaf) is None:
        return key.default
    settings = chk.mapping(raw.get(key.leaf), path, "the Ray settings")
    if settings is None:
        return key.default
    chk.unknown_keys(settings, [k.leaf for k in RAY_KEYS], path, "loader.ray")
    values = {}
    for leaf in RAY_KEYS:
        if leaf.type == "integer":
            values[leaf.leaf] = (None if settings.get(leaf.leaf) in leaf.words
                                 else check_int(chk, settings, leaf, allow_none=True))
    address = settings.get("address")
    if address is not None and (not isinstance(address, str) or not (address == "auto"
                                                                       or _RAY_ADDRESS.fullmatch(address))):
        chk.add(path + ("address",), f"expected auto, ray://host:port (Ray Client), host:port (the head node's GCS) "
                                     f"or null (a local cluster), found {type_name(address)} {quoted(address)}")
        address = None
    return RaySettings(address=address, **values)


# How each loader key is read (its choices, range and default are in the schema, under
# ``loader.NAME``), named as its LoaderSpec field, in the order the unknown-key message lists them.
LOADER_KEYS: dict[str, KeyReader] = {
    "workers": _workers,
    "prefetch": check_int,
    "last_batch": check_choice,
    "on_error": check_choice,
    "shuffle": _shuffle,
    "repeated_augmentations": check_int,
    "report_starvation": _flag,
    "shuffle_window": check_int,
    "executor": check_choice,
    "ray": _ray,
}


def check_loader(chk: ProblemCollector, data: dict) -> LoaderSpec:
    """The ``loader`` mapping, key by key through :data:`LOADER_KEYS`."""
    raw = chk.mapping(data.get("loader"), ("loader",), "the loader settings") or {}
    chk.unknown_keys(raw, LOADER_KEYS, ("loader",), "loader")
    return LoaderSpec(**{name: read(chk, raw, KEYS[f"loader.{name}"]) for name, read in LOADER_KEYS.items()})
