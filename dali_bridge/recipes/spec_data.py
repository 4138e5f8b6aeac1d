"""Pipeline data from converted ops, validated by the spec layer; its problems name what they came
from (a transform, a timm argument) instead of the position in the generated ``ops`` list."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import RecipeError

if TYPE_CHECKING:
    from ..spec.pipeline import PipelineSpec

_OP_PATH = re.compile(r"^ops\[(\d+)\]\.?(.*)$")
_VIEW_OP_PATH = re.compile(r"^views\.([^.]+)\.ops\[(\d+)\]\.?(.*)$")


def source_data(source: Any) -> dict[str, Any]:
    """``source=``: a folder path (ImageFolder layout) or a source mapping as a pipeline file writes it."""
    if isinstance(source, (str, Path)):
        return {"type": "folder", "root": str(source)}
    if isinstance(source, Mapping):
        return dict(source)
    raise RecipeError([f"source: expected a folder path or a source mapping ({{type: folder, root: DIR}}), "
                       f"found {type(source).__name__}"])


def build_spec(ops: Sequence[dict], labels: Sequence[str], *, source: Any, batch_size: int, name: str,
               origin: str, label_smoothing: float = 0.0, loader: Mapping[str, Any] | None = None,
               overrides: Mapping[str, Any] | None = None, views: Mapping[str, Any] | None = None,
               view_labels: Mapping[str, Sequence[str]] | None = None) -> "PipelineSpec":
    """A validated :class:`~dali_bridge.spec.pipeline.PipelineSpec` of ``ops`` (``{op: params}`` each, ``labels[i]``
    saying where op i came from). A batch-mixing op or label smoothing outputs ``target`` (soft targets).
    ``views``: the ``views`` section (its groups' chains after ``ops``), outputs ``views`` and ``label``;
    ``view_labels``: per group, where each op of its chain came from."""
    from ..ops.registry import OPS
    from ..spec.pipeline import spec_from_dict
    from ..spec.problems import SpecError

    data: dict[str, Any] = {"version": 1, "name": name, "source": source_data(source), "batch_size": batch_size,
                            "ops": [dict(op) for op in ops]}
    mixes = any(OPS[next(iter(op))].category == "batch" for op in ops if next(iter(op)) in OPS)
    if mixes or label_smoothing:
        data.update(outputs=["image", "target"], target={"label_smoothing": label_smoothing})
    if views:
        data.update(views={name: dict(group) for name, group in views.items()}, outputs=["views", "label"])
    if loader:
        data["loader"] = dict(loader)
    try:
        return spec_from_dict(data, origin=origin, overrides=overrides)
    except SpecError as exc:
        raise RecipeError([_relabel(problem, labels, view_labels or {}) for problem in exc.problems], origin) from None


def _relabel(problem: Any, labels: Sequence[str], view_labels: Mapping[str, Sequence[str]]) -> str:
    view = _VIEW_OP_PATH.match(problem.path)
    group_labels = view_labels.get(view.group(1), ()) if view else ()
    if view and int(view.group(2)) < len(group_labels):
        rest = view.group(3).split(".", 1)  # "<op>.<parameter>": the parameter is what the user set
        where = group_labels[int(view.group(2))] + (f": {rest[1]}" if len(rest) == 2 else "")
        return f"views.{view.group(1)}: {where}: {problem.message}"
    match = _OP_PATH.match(problem.path)
    if match and int(match.group(1)) < len(labels):
        rest = match.group(2).split(".", 1)  # "<op>.<parameter>": the parameter is what the user set
        where = f"{labels[int(match.group(1))]}: {rest[1]}" if len(rest) == 2 else labels[int(match.group(1))]
        return f"{where}: {problem.message}"
    return f"{problem.path}: {problem.message}"
