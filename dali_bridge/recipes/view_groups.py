"""Views as a pipeline file's ``views`` groups: one chain of ops per view (each ``{op: params}``) grouped
as the file writes them — a group per run of views with the same ops and output size, the first
view's chain as the group's ``ops`` and, per view, only the parameters it sets otherwise
(``per_view``). SimCLR's two views are one group; BYOL's and DINO's two global views are one group
whose second view blurs rarely and solarises; DINO's local views are a group of their own.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import RecipeError

__all__ = ["ViewChain", "group_views"]

ViewChain = Sequence[Mapping[str, Any]]  # one view's ops, each {op name: params}


def _name(op: Mapping[str, Any]) -> str:
    return next(iter(op))


def _params(op: Mapping[str, Any]) -> dict[str, Any]:
    return dict(op[_name(op)] or {})


def _differences(base: ViewChain, chain: ViewChain, size_params: Mapping[str, str | None]) -> str | None:
    """Why ``chain`` cannot be a view of the group whose first view is ``base`` (None when it can)."""
    names = [_name(op) for op in base]
    if [_name(op) for op in chain] != names:
        return f"its ops ({', '.join(_name(op) for op in chain)}) are not the group's ({', '.join(names)})"
    for mine, first in zip(chain, base):
        name = _name(mine)
        size = size_params.get(name)
        if size and _params(mine).get(size) != _params(first).get(size):
            return f"its {name} {size} {_params(mine).get(size)!r} is not the group's {_params(first).get(size)!r}"
        if names.count(name) > 1 and _params(mine) != _params(first):
            return f"its {name}, which the group's ops hold {names.count(name)} times, differs"
    return None


def _changes(base: ViewChain, chain: ViewChain) -> dict[str, dict[str, Any]]:
    """The parameters each op of ``chain`` sets otherwise than ``base`` does (the view's ``per_view``); a
    parameter one of them leaves out has the op's default."""
    from ..ops.registry import OPS

    found = {}
    for mine, first in zip(chain, base):
        op = OPS[_name(mine)]
        ours, theirs = _params(mine), _params(first)
        changed = {}
        for key in sorted(set(ours) | set(theirs), key=[p.name for p in op.params].index):
            default = op.param(key).default
            if ours.get(key, default) != theirs.get(key, default):
                changed[key] = ours.get(key, default)
        if changed:
            found[_name(mine)] = changed
    return found


def _group(chains: Sequence[ViewChain]) -> dict[str, Any]:
    group: dict[str, Any] = {"count": len(chains), "ops": [dict(op) for op in chains[0]]}
    per_view = [_changes(chains[0], chain) for chain in chains]
    if any(per_view):
        group["per_view"] = per_view
    return group


def group_views(chains: Sequence[ViewChain] | Mapping[str, Sequence[ViewChain]], *,
                size_params: Mapping[str, str | None], origin: str) -> dict[str, dict[str, Any]]:
    """The ``views`` section of ``chains``: a list (one chain per view, grouped in runs of views alike:
    ``views`` for one group, else ``views_1``, ``views_2`` ...) or a mapping of group name → its views'
    chains (each group's views must be alike). ``size_params``: op name → the parameter that sets its
    output size (a group's views share it). Raises :class:`RecipeError` naming a view that differs
    from its named group."""
    if isinstance(chains, Mapping):
        problems = []
        for name, views in chains.items():
            problems += [f"views group '{name}', view {n}: {why}; a group's views share their ops and size: "
                         f"give it a group of its own" for n, chain in enumerate(views)
                         if (why := _differences(views[0], chain, size_params))]
        if problems:
            raise RecipeError(problems, origin)
        return {name: _group(views) for name, views in chains.items()}
    runs: list[list[ViewChain]] = []
    for chain in chains:
        if runs and _differences(runs[-1][0], chain, size_params) is None:
            runs[-1].append(chain)
        else:
            runs.append([chain])
    names = ["views"] if len(runs) == 1 else [f"views_{n + 1}" for n in range(len(runs))]
    return {name: _group(run) for name, run in zip(names, runs)}
