"""The ``views`` section: named groups of views of each image, each with a count, its own chain of
ops after the shared ``ops`` (ending in the group's output size and finish), and per view the few
parameters that differ (``per_view``); and what ``outputs`` must say with views.

Each group's chain is checked as a pipeline's ``ops`` are (each op by its registry entry, then the
rules across ops over the shared ops and the group's), each ``per_view`` parameter by its op's own
check, every problem at the key that holds it.
"""
from __future__ import annotations

import copy
import difflib
import re
from typing import Any

from ..ops.facets import Sizing, SpecRules, facet
from ..ops.registry import OPS
from ..util.checks import is_int, type_name
from ..util.quoting import quoted
from .keys import KEYS
from .model import OpSpec, ViewGroupSpec
from .op_keys import check_op_chain, check_op_list
from .problems import ProblemCollector

# The keys of one group, in the order the unknown-key message lists them.
GROUP_KEYS = ("count", "ops", "per_view")
# A group's name is a key of --set paths (views.NAME.ops.0...): no dots, no spaces.
_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
# Where each op kind may stand: the shared ops run once on the decoded uint8 image, before any view;
# a group's chain holds per-sample ops and one finish, and nothing that runs on the whole batch.
_SHARED_CATEGORIES = ("geometry", "pixel")
_GROUP_REFUSED = ("batch", "after_finish")


def check_views(chk: ProblemCollector, data: dict, shared: list[OpSpec]) -> tuple[ViewGroupSpec, ...]:
    """``views``: each group (count, ops, per_view), the shared ``ops`` they follow; () without views."""
    raw = data.get("views")
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        chk.add(("views",), f"expected named groups of views as a mapping (e.g. views: {{global: {{count: 2, ops: "
                            f"[...]}}}}), found {type_name(raw)} {quoted(raw)}")
        return ()
    raw_shared = data.get("ops") or []
    if isinstance(raw_shared, list) and len(shared) == len(raw_shared):
        _check_shared(shared, chk)
    groups = [_check_group(chk, name, group, shared, raw_shared) for name, group in raw.items()]
    total, most = sum(group.count for group in groups if group is not None), KEYS["views"].maximum
    if total > most.value:
        chk.add(("views",), f"expected at most {most.value} views in all ({most.why}), found {total}")
    return tuple(group for group in groups if group is not None)


def _check_shared(shared: list[OpSpec], chk: ProblemCollector) -> None:
    """The shared ``ops`` of a pipeline with views: per-sample ops on the uint8 image only (each group ends
    its own chain, finish included)."""
    for n, op in enumerate(shared):
        category = OPS[op.name].category
        if category not in _SHARED_CATEGORIES:
            chk.add(("ops", n), f"'{op.name}' cannot be a shared op of a pipeline with views: the shared ops run "
                                f"once on the decoded image before the views are cut; move it into each group's "
                                f"ops (views.NAME.ops)")


def _check_group(chk: ProblemCollector, name: Any, raw: Any, shared: list[OpSpec],
                 raw_shared: Any) -> ViewGroupSpec | None:
    path = ("views", name)
    if not isinstance(name, str) or not _GROUP_NAME.match(name):
        chk.add(path, f"expected a group name of letters, digits, '_' and '-' (it is a key of --set paths: "
                      f"views.NAME.ops.0...), found {quoted(name)}")
        return None
    group = chk.mapping(raw, path, f"views group '{name}' ({{count, ops, per_view}})")
    if group is None:
        return None
    chk.unknown_keys(group, GROUP_KEYS, path, f"views group '{name}'")
    count = group.get("count", 1)
    if not is_int(count) or count < 1:
        chk.add(path + ("count",), f"expected the group's number of views, an integer >= 1, found "
                                   f"{type_name(count)} {quoted(count)}")
        count = 1
    ops = check_op_list(group.get("ops"), chk, path + ("ops",))
    readable = isinstance(group.get("ops"), list) and len(ops) == len(group["ops"])
    for n, op in enumerate(ops if readable else ()):
        if OPS[op.name].category in _GROUP_REFUSED:
            chk.add(path + ("ops", n), f"'{op.name}' runs on the whole batch or after it, which a pipeline with "
                                       f"views does not have (each view is its own batch): remove it")
    if readable and isinstance(raw_shared, list) and len(shared) == len(raw_shared):
        paths = [("ops", n) for n in range(len(shared))] + [path + ("ops", n) for n in range(len(ops))]
        check_op_chain([*shared, *ops], chk, paths, path + ("ops",))
    per_view = _check_per_view(chk, group.get("per_view"), path, count, ops if readable else None)
    return ViewGroupSpec(name, count, tuple(ops), per_view)


def _check_per_view(chk: ProblemCollector, raw: Any, path: tuple, count: int,
                    ops: list[OpSpec] | None) -> tuple[dict, ...]:
    """``per_view``: one mapping per view (``count`` of them), op name → the parameters that view sets."""
    if raw is None:
        return ()
    where = path + ("per_view",)
    if not isinstance(raw, list) or len(raw) != count:
        chk.add(where, f"expected a list of {count} mappings (one per view of the group, count {count}; {{}} for a "
                       f"view that changes nothing), found {type_name(raw)} {quoted(raw)}")
        return ()
    views = []
    for v, changes in enumerate(raw):
        changes = chk.mapping(changes, where + (v,), f"view {v}'s changes (op name: {{parameter: value}})") or {}
        views.append({} if ops is None else _check_view_changes(chk, changes, where + (v,), ops))
    return tuple(views)


def _check_view_changes(chk: ProblemCollector, changes: dict, where: tuple, ops: list[OpSpec]) -> dict:
    """One view's changes: each names an op of the group (once in it) and parameters that op takes, each
    valid by the op's own check, none of them the output size (a group's views share one)."""
    names = [op.name for op in ops]
    found: dict[str, dict] = {}
    for name, params in changes.items():
        op_path = where + (name,)
        if name not in names:
            hint = difflib.get_close_matches(str(name), names, n=1)
            chk.add(op_path, f"{quoted(name)} is not an op of this group (its ops: {', '.join(names)})"
                             + (f"; did you mean '{hint[0]}'?" if hint else ""))
            continue
        if names.count(name) > 1:
            chk.add(op_path, f"'{name}' appears {names.count(name)} times in this group's ops, so a view's change "
                             f"cannot say which: give each its own group")
            continue
        if not isinstance(params, dict):
            chk.add(op_path, f"expected the parameters to set as a mapping, found {type_name(params)} {quoted(params)}")
            continue
        op = OPS[name]
        base = ops[names.index(name)]
        chk.unknown_keys(params, [p.name for p in op.params], op_path, f"op '{name}'")
        size_param = facet(op, Sizing).size_param
        resolved = {}
        for param in op.params:
            if param.name not in params:
                continue
            if param.name == size_param:
                chk.add(op_path + (param.name,), "a group's views share one output size: put a view of another "
                                                 "size in a group of its own")
                continue
            value, message = param.validate(params[param.name])
            if message:
                chk.add(op_path + (param.name,), message)
                continue
            resolved[param.name] = copy.deepcopy(value)
        merged = {**base.params, **resolved}
        for key, message in facet(op, SpecRules).extra_check(merged):
            chk.add(op_path + (key,), message)
        found[name] = resolved
    return found


def check_views_outputs(chk: ProblemCollector, outputs: Any, views: Any) -> None:
    """``outputs`` with views: ``views`` in place of ``image``; without a views section, no ``views``."""
    if not isinstance(outputs, list):
        return
    if views is None:
        if "views" in outputs:
            chk.add(("outputs",), "the 'views' output needs a views section (groups of views of each image); "
                                  "without one, the batch's images are the 'image' output")
        return
    if "views" not in outputs:
        chk.add(("outputs",), "a pipeline with views gives its images as the 'views' output (a list of [N, C, H, W] "
                              "batches): add 'views' to outputs, e.g. outputs: [views, label]")
    for name in ("image", "target"):
        if name in outputs:
            chk.add(("outputs", outputs.index(name)),
                    f"a pipeline with views has no '{name}' output (its images are the 'views' output, its "
                    f"labels the 'label' output): remove it")
