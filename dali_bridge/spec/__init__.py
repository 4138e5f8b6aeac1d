"""Pipeline files: YAML → a validated, typed :class:`PipelineSpec`.

Every problem in a file is collected in one pass and reported together, each with
``file:line:column``, the key path (``ops[1].random_resized_crop.scale``), what was expected and
what was found. YAML is data: it is read with ``yaml.safe_load`` (positions come from composing
the same text with the safe loader), so nothing in a pipeline file can execute code.

This package is the one import face of the spec layer; its modules, bottom up:
:mod:`~dali_bridge.spec.keys` (the schema: every key outside the ops, its type, choices or range,
default and meaning, which validation and the reference page both read),
:mod:`~dali_bridge.spec.model` (the vocabulary and the typed settings),
:mod:`~dali_bridge.spec.problems` (problems and their collector),
:mod:`~dali_bridge.spec.reading` (YAML within bounds, with positions),
:mod:`~dali_bridge.spec.op_keys`, :mod:`~dali_bridge.spec.source_keys` and
:mod:`~dali_bridge.spec.pipeline_keys` (the validators of each section),
:mod:`~dali_bridge.spec.overrides` (``--set``), :mod:`~dali_bridge.spec.pipeline` (the entry points)
and :mod:`~dali_bridge.spec.reference` (the reference page, generated from the schema and the op registry).
The value checks and UTF-8 helpers they share with the rest of the package sit below it, in
:mod:`dali_bridge.util.checks` and :mod:`dali_bridge.util.text`.

Pure Python: this layer never imports DALI or torch.
"""
from __future__ import annotations
