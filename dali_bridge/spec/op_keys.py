"""The ``ops`` list: each op's parameters checked by its registry entry, then the rules across ops
(the order of op kinds, crops that fit, a fixed output size).

:func:`op_entry` is the one reader of an item's shorthand (``- horizontal_flip``, ``- resize: 256``):
the validator and the overrides read items through it.
"""
from __future__ import annotations

import copy
import difflib
from typing import Any

from ..util.checks import fixed_output_size, size_checker, type_name
from ..ops.base import REQUIRED
from ..ops.registry import OPS, op_names
from ..util.quoting import quoted
from .keys import KEYS
from .model import OpSpec
from .problems import ProblemCollector, format_path
from ..ops.facets import Sizing, SpecRules, facet


def op_entry(entry: Any) -> tuple[Any, Any] | None:
    """An ``ops`` item as (name, parameters); None when it is not one op (a list, several keys).

    ``- horizontal_flip`` and ``- flip:`` have no parameters (``{}``); ``- resize: 256`` sets the op's
    primary parameter (``{"size": 256}``). Parameters that are no mapping are returned as written when
    they cannot be read as the primary one (an unknown op, an op without a primary parameter).
    """
    if isinstance(entry, str):
        return entry, {}
    if not (isinstance(entry, dict) and len(entry) == 1):
        return None
    name, params = next(iter(entry.items()))
    if params is None:
        return name, {}
    op = OPS.get(name)
    if not isinstance(params, dict) and op is not None and op.primary is not None:
        return name, {op.primary: params}
    return name, params


def check_all_ops(chk: ProblemCollector, data: dict, *, required: bool = True) -> list[OpSpec]:
    """``ops``: each op, then the rules across ops when every op is readable. ``required=False`` (a
    pipeline with views, whose groups end the chains): the list may be absent or empty, and its ops
    are checked with each group's (:mod:`~dali_bridge.spec.view_keys`)."""
    raw_ops = data.get("ops")
    if raw_ops is None and not required:
        return []
    ops = check_op_list(raw_ops, chk, ("ops",))
    if not required:
        return ops
    if isinstance(raw_ops, list) and len(ops) == len(raw_ops):  # cross-op rules need every op readable
        check_op_chain(ops, chk, [("ops", i) for i in range(len(ops))], ("ops",))
    if isinstance(raw_ops, list) and not raw_ops:
        chk.add(("ops",), "expected at least one op (the output size must be fixed to batch images)")
    return ops


def check_op_list(raw_ops: Any, chk: ProblemCollector, path: tuple) -> list[OpSpec]:
    """The list of ops at ``path`` (``("ops",)``, ``("views", "global", "ops")``), each op checked by
    its registry entry; the readable ones, in order."""
    if raw_ops is None:
        chk.add(path, "missing required key 'ops' (expected a list of ops, e.g. - center_crop: 224)")
        return []
    if not isinstance(raw_ops, list):
        chk.add(path, f"expected a list of ops, found {type_name(raw_ops)} {quoted(raw_ops)}")
        return []
    most = KEYS["ops"].maximum
    if len(raw_ops) > most.value:
        chk.add(path, f"expected at most {most.value} ops ({most.why}), found {len(raw_ops)}")
        return []
    ops = [_check_op(entry, path + (i,), chk) for i, entry in enumerate(raw_ops)]
    return [op for op in ops if op is not None]


def _check_op(entry: Any, item_path: tuple, chk: ProblemCollector) -> OpSpec | None:
    """One ``ops`` item: a known op whose parameters its registry entry accepts (defaults filled in)."""
    parsed = op_entry(entry)
    if parsed is None:
        chk.add(item_path, "expected an op as '- name: {params}' (one key per list item), "
                           f"found {type_name(entry)} {quoted(entry)}")
        return None
    name, params = parsed
    if name not in OPS:
        hint = difflib.get_close_matches(str(name), op_names(), n=1, cutoff=0.5)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        chk.add(item_path + (name,) if isinstance(entry, dict) else item_path,
                f"unknown op {quoted(str(name))} (known ops: {', '.join(op_names())}){suggestion}")
        return None
    op = OPS[name]
    op_path = item_path + (name,)
    if not isinstance(params, dict):  # an op without a primary parameter given a bare value
        chk.add(op_path, f"expected the parameters of {quoted(str(name))} as a mapping, "
                         f"found {type_name(params)} {quoted(params)}")
        return None
    chk.unknown_keys(params, [p.name for p in op.params], op_path, f"op '{name}'", hints=facet(op, SpecRules).key_hints)
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
    if all(p.name in resolved for p in op.params):
        for key, message in facet(op, SpecRules).extra_check(resolved):
            chk.add(op_path + (key,), message)
    return OpSpec(name, resolved)


# Where each op kind runs, in the order ops must come: per-sample ops on uint8 images, the finish,
# per-sample ops on the finished float images, batch-level ops (kinds not listed: uint8 ops).
_KIND_STAGE = {"finish": 1, "compound": 1, "after_finish": 2, "batch": 3}


def _check_op_order(ops: list[OpSpec], chk: ProblemCollector, paths: list[tuple]) -> None:
    """Per-sample uint8 ops, then one finish, then ops after the finish (which need a float finish),
    batch-level ops last and at most one of them."""
    finishing = [n for n, op in enumerate(ops) if OPS[op.name].category in ("finish", "compound")]
    if len(finishing) > 1:
        chk.add(paths[finishing[1]], "only one normalize/crop_mirror_normalize op is allowed")
    batch_ops = [n for n, op in enumerate(ops) if OPS[op.name].category == "batch"]
    if len(batch_ops) > 1:
        first, second = ops[batch_ops[0]].name, ops[batch_ops[1]].name
        chk.add(paths[batch_ops[1]], f"only one batch-level op is allowed, found '{first}' and "
                                                f"'{second}': to pick MixUp or CutMix per batch, use one batch_mix op")
    stages = [_KIND_STAGE.get(OPS[op.name].category, 0) for op in ops]
    for n in finishing:
        later = next((m for m in range(n + 1, len(ops)) if stages[m] == 0), None)
        if later is not None:
            chk.add(paths[n], f"'{ops[n].name}' must come after every op on uint8 images (it converts "
                              f"dtype and layout); {format_path(paths[later])} '{ops[later].name}' follows it")
    for n, op in enumerate(ops):
        before = next((m for m in range(n) if stages[m] > stages[n]), None)
        if stages[n] == 2 and before is not None:  # a per-sample op after a batch-level one
            chk.add(paths[n], f"'{op.name}' must come before {format_path(paths[before])} '{ops[before].name}' "
                              f"(batch-level ops come last)")
        if stages[n] >= 2:
            finish = next((ops[m] for m in finishing if m < n), None)
            if finish is None or facet(OPS[finish.name], Sizing).output_dtype(finish.params) == "uint8":
                chk.add(paths[n], f"'{op.name}' runs on the normalised float images: put a normalize "
                                  f"(dtype float32 or float16) before it")


def check_op_chain(ops: list[OpSpec], chk: ProblemCollector, paths: list[tuple], list_path: tuple) -> None:
    """Cross-op rules over one chain of ops (``paths``: where each op is written; ``list_path``: where the
    chain's fixed size is asked for): the order of op kinds (:func:`_check_op_order`); crops fit; the
    output size is fixed."""
    _check_op_order(ops, chk, paths)
    state: Any = None  # None (input size), ("short", s) or (h, w); "unknown" after an invalid size
    for n, op in enumerate(ops):
        op_path = paths[n] + (op.name,)
        sizing = facet(OPS[op.name], Sizing)
        key, rule = sizing.size_param, sizing.size_rule  # how the op sets the size
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
        chk.add(list_path, "the pipeline's output size is not fixed, so images cannot be batched: end with "
                          "random_resized_crop, center_crop, or resize to [height, width]")
