"""Spec → plan: the backend-neutral list of op instances.

The plan lowers every op of the spec through its registry entry (``crop_mirror_normalize`` →
centre crop, flip, normalize), with sizes in (height, width) form, and ends the per-sample steps
with the finish (dtype, normalisation, layout). It says what runs, not how a backend runs it: where
each step runs on each backend is :func:`dali_bridge.loader.placement.placement`, and which steps a DALI
graph runs is DALI's own planning (:class:`~dali_bridge.backends.dali.plan.DaliPlan`). Nothing
here imports a backend.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol, Sequence

from ..ops.registry import OPS, unsupported_options
from ..ops.base import Category, Step
from ..ops.finish import IMPLICIT_FINISH, Finish, Normalize
from ..ops.facets import Sizing, SpecRules, facet

__all__ = ["LoweredSpec", "Placed", "Plan", "build_plan", "unsupported_ops", "unsupported_places"]


class LoweredSpec(Protocol):
    """What the plan reads of a validated :class:`~dali_bridge.spec.pipeline.PipelineSpec`: its ops (each with a
    registered ``name`` and its ``params``), the decode device and the parity: a protocol, as the plan
    needs no more of the spec (and recipes lower specs they are building through it)."""
    ops: Sequence[Any]
    decode_device: str
    parity: str


@dataclass(frozen=True)
class Plan:
    """``all_steps``: every step (op instance) in order — the per-sample steps (:attr:`steps`), the
    finish, then (when such ops exist) ops after normalisation and batch-level ops (:attr:`post_finish`,
    see :mod:`dali_bridge.ops`). A step's position in it keys its draws."""
    all_steps: tuple[Step, ...]
    output_size: tuple[int, int]  # (height, width) in pixels
    decode_device: str            # as declared: mixed | cpu
    parity: str = "exact"         # exact: DALI reproduces torchvision's resize borders; fast: plain fn.resize
    # A pipeline with views: each view is a plan of its own (the shared ops, then its group's chain).
    view: int | None = None       # the view's number across all groups: a term of its draws' key (None: no views)
    shared_steps: int = 0         # its leading steps (the shared ops), drawn once per sample, without the view's key
    group: str = ""               # the views group it belongs to
    views: tuple["Plan", ...] = ()  # on the plan build_plan returns: every view's plan, in output order

    @property
    def view_plans(self) -> tuple["Plan", ...]:
        """The plan of each image a sample gives, in output order: every view's, or the plan itself."""
        return self.views or (self,)

    @property
    def ops(self) -> tuple[Step, ...]:
        """:attr:`all_steps`, under its older name."""
        return self.all_steps

    @cached_property  # a plan never changes; executors ask per sample
    def finish_position(self) -> int:
        return next(n for n, step in enumerate(self.all_steps) if step.op.category is Category.FINISH)

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The per-sample steps on uint8 images, before the finish."""
        return self.all_steps[:self.finish_position]

    @cached_property
    def post_finish(self) -> tuple[tuple[int, Step], ...]:
        """(position in ``all_steps``, step) of each op after the finish: per-sample ops on the float images,
        then batch-level ops. The loader applies them (:mod:`dali_bridge.loader.post_finish`); no executor sees them."""
        return tuple((n, step) for n, step in enumerate(self.all_steps) if n > self.finish_position)

    @property
    def finish_step(self) -> Step:
        return self.all_steps[self.finish_position]

    @property
    def finish(self) -> Finish:
        return Normalize.finish(self.finish_step.params)

    @property
    def random(self) -> bool:
        return any(step.random for step in self.all_steps)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        h, w = self.output_size
        return (batch, 3, h, w) if self.finish.layout == "CHW" else (batch, h, w, 3)


def build_plan(spec: LoweredSpec) -> Plan:
    """Lower a validated spec into a plan. With views (the spec's ``views`` groups), each view's plan
    lowers the shared ops then its group's chain with its own parameters; the plan returned is the
    first view's, holding them all in :attr:`Plan.views`."""
    groups = getattr(spec, "views", ())
    if not groups:
        return _chain_plan(spec.ops, spec)
    plans: list[Plan] = []
    for group in groups:
        for v in range(group.count):
            chain = _chain_plan([*spec.ops, *group.view_ops(v)], spec)
            shared = sum(1 for step in chain.all_steps if step.op_index < len(spec.ops))
            plans.append(replace(chain, view=len(plans), shared_steps=shared, group=group.name))
    return replace(plans[0], views=tuple(plans))


def _chain_plan(chain: Sequence[Any], spec: LoweredSpec) -> Plan:
    """The plan of one chain of ops (each with ``name`` and ``params``)."""
    ops: list[Step] = []
    size: tuple[int, int] | None = None
    for index, op in enumerate(chain):
        definition = OPS[op.name]
        ops += facet(definition, SpecRules).lower(dict(op.params), index)
        size = facet(definition, Sizing).fixed_size(op.params) or size  # a shorter-side resize leaves the size open
    if not any(step.op.category is Category.FINISH for step in ops):
        ops += facet(OPS["normalize"], SpecRules).lower(dict(IMPLICIT_FINISH), len(chain))
    if size is None:
        raise ValueError("plan has no fixed output size (the spec validator should have caught this)")
    return Plan(tuple(ops), size, spec.decode_device, spec.parity)


@dataclass(frozen=True)
class Placed:
    """One stage of a backend's execution: what it does, the implementation, and the device."""
    stage: str
    implementation: str
    device: str


def unsupported_ops(spec: LoweredSpec, backend: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(op position, op name, backends that support it) for every op ``backend`` cannot run.

    An op whose options only some backends reproduce is named with them (``resize with
    interpolation bicubic with antialias false (...)``, see
    :meth:`~dali_bridge.ops.facets.SpecRules.unsupported_options`).
    """
    found = [(i, op.name, OPS[op.name].backends) for i, op in enumerate(spec.ops)
             if backend not in OPS[op.name].backends]
    for i, op in enumerate(spec.ops):
        found += [(i, f"{op.name} with {what}", backends) for what, backends in unsupported_options(op.name, op.params)
                  if backend not in backends and backend in OPS[op.name].backends]
    return sorted(found, key=lambda item: item[0])


def unsupported_places(spec: LoweredSpec, backend: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """:func:`unsupported_ops` of the shared ops and of every views group's chain (and view's changes),
    each placed by the key that holds it: ``ops[1]``, ``views.global.ops[2]``."""
    found = [(f"ops[{i}]", name, backends) for i, name, backends in unsupported_ops(spec, backend)]
    for group in getattr(spec, "views", ()):
        seen: set = set()
        for v in range(group.count):
            chain = _Chain(group.view_ops(v))
            for i, name, backends in unsupported_ops(chain, backend):
                if (i, name) not in seen:
                    seen.add((i, name))
                    found.append((f"views.{group.name}.ops[{i}]", name, backends))
    return found


@dataclass(frozen=True)
class _Chain:
    """One chain of ops as :func:`unsupported_ops` reads a spec."""
    ops: Sequence[Any]
