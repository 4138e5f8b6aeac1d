"""Pipeline files: YAML → a validated, typed :class:`PipelineSpec`.

Every problem in a file is collected in one pass and reported together, each with
``file:line:column``, the key path (``ops[1].random_resized_crop.scale``), what was expected and
what was found. YAML is data: it is read with ``yaml.safe_load`` (positions come from composing
the same text with the safe loader), so nothing in a pipeline file can execute code.

This package is the one import face of the spec layer; its modules, bottom up:
:mod:`~dali_bridge.spec.model` (the vocabulary and the typed settings),
:mod:`~dali_bridge.spec.problems` (problems and their collector),
:mod:`~dali_bridge.spec.reading` (YAML within bounds, with positions),
:mod:`~dali_bridge.spec.op_keys`, :mod:`~dali_bridge.spec.source_keys` and
:mod:`~dali_bridge.spec.pipeline_keys` (the validators of each section),
:mod:`~dali_bridge.spec.overrides` (``--set``) and :mod:`~dali_bridge.spec.pipeline` (the entry points).
The value checks and UTF-8 helpers they share with the rest of the package sit below it, in
:mod:`dali_bridge.checks` and :mod:`dali_bridge.text`.

Pure Python: this layer never imports DALI or torch.
"""
from __future__ import annotations

from ..text import NotUtf8Error, decode_utf8, text_problem
from .model import (BACKENDS, DECODE_DEVICES, DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS, DEFAULT_MAX_BYTES,
                    DEFAULT_SHUFFLE_WINDOW, EXECUTORS, FORMAT_VERSION, LAST_BATCH, MAX_OPS, MAX_REPEATED_AUGMENTATIONS,
                    MAX_REQUESTS, MAX_SEED, MAX_SHUFFLE_WINDOW, ON_ERROR, OUTPUTS, PARITY, PLANNED_SOURCE_TYPES,
                    SOURCE_TYPES, LoaderSpec, OpSpec, SourceSpec)
from .overrides import SetFlags, apply_overrides, parse_override, parse_overrides
from .pipeline import PipelineSpec, coerce_spec, load_spec, missing_source_warnings, spec_from_dict
from .problems import MISSING_SOURCE, Problem, SpecError, format_path
from .reading import ALIAS_NODE_BUDGET, MAX_NESTING

__all__ = ["ALIAS_NODE_BUDGET", "BACKENDS", "DECODE_DEVICES", "DEFAULT_EXTENSIONS", "DEFAULT_IMAGE_KEYS",
           "DEFAULT_MAX_BYTES", "DEFAULT_SHUFFLE_WINDOW", "EXECUTORS", "FORMAT_VERSION", "LAST_BATCH", "MAX_NESTING",
           "MAX_OPS",
           "MAX_REPEATED_AUGMENTATIONS", "MAX_REQUESTS", "MAX_SEED", "MAX_SHUFFLE_WINDOW", "MISSING_SOURCE",
           "NotUtf8Error", "ON_ERROR", "OUTPUTS", "PARITY", "PLANNED_SOURCE_TYPES", "SOURCE_TYPES", "LoaderSpec",
           "OpSpec", "PipelineSpec", "Problem", "SetFlags", "SourceSpec", "SpecError", "apply_overrides",
           "coerce_spec", "decode_utf8", "format_path", "load_spec", "missing_source_warnings", "parse_override",
           "parse_overrides", "spec_from_dict", "text_problem"]
