"""The validated pipeline (:class:`PipelineSpec`) and the entry points that make one: from raw data
(:func:`spec_from_dict`), from a file (:func:`load_spec`), from any of those (:func:`coerce_spec`).

Each entry point reads every section (the ``*_keys`` modules), collecting every problem before it
raises one :class:`~dali_bridge.spec.problems.SpecError`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from ..util.checks import type_name
from .model import DEFAULT_MAX_PIXELS
from ..util.urls import is_url
from ..util.text import NotUtf8Error, decode_utf8
from .keys import KEYS, section_keys
from .model import DEFAULT_MAX_BYTES, LoaderSpec, OpSpec, SourceSpec, ViewGroupSpec
from .op_keys import check_all_ops
from .overrides import apply_overrides, parse_overrides
from .pipeline_keys import check_identity, check_loader, check_outputs, check_target
from .problems import MISSING_SOURCE, Problem, ProblemCollector, SpecError, check_choice, check_int
from .reading import positions, read_yaml
from .shipped import resolve_pipeline
from .view_keys import check_views, check_views_outputs
from .source_keys import check_source, check_source_paths


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
    views: tuple[ViewGroupSpec, ...] = ()  # groups of views cut from each decode; () : one image per sample
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
        elif self.source.type == "parquet":
            source.update(files=list(self.source.files or ()), image_column=self.source.image_column,
                          label_column=self.source.label_column)
        else:
            source["extensions"] = list(self.source.extensions)
        if source_at_url(self.source):
            source.update(storage_options=copy.deepcopy(dict(self.source.storage_options)),
                          max_requests=self.source.max_requests, timeout=self.source.timeout)
            if self.source.redirect_hosts:
                source["redirect_hosts"] = list(self.source.redirect_hosts)
            if self.source.cache_dir is not None:
                source["cache"] = {"dir": self.source.cache_dir, "max_bytes": self.source.cache_max_bytes}
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
            **({"views": {group.name: _group_dict(group) for group in self.views}} if self.views else {}),
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
                **({"ray": dict(vars(self.loader.ray))} if self.loader.ray is not None else {}),
            },
        }

    def to_yaml(self) -> str:
        """The resolved spec as YAML; ``load_spec`` of it gives an equal spec."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def replace(self, **overrides: Any) -> "PipelineSpec":
        """A new spec with dotted-path overrides applied and validated (see :func:`apply_overrides`)."""
        return spec_from_dict(self.to_dict(), origin=self.origin, overrides=overrides)



def _group_dict(group: ViewGroupSpec) -> dict[str, Any]:
    """A views group as plain data, as a file writes it."""
    out: dict[str, Any] = {"count": group.count,
                           "ops": [{op.name: copy.deepcopy(dict(op.params))} for op in group.ops]}
    if group.per_view:
        out["per_view"] = [copy.deepcopy({name: dict(params) for name, params in view.items()})
                           for view in group.per_view]
    return out


def source_at_url(source: SourceSpec) -> bool:
    """Whether the source's samples are read through object storage: shards, Parquet files, a file
    list or the root its entries resolve against at a URL."""
    locations = [source.shards, source.file_list, source.root if source.type == "file_list" else None,
                 *(source.files or ())]
    return any(isinstance(location, str) and is_url(location) for location in locations)


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
        problem = Problem(origin, "<top level>", f"expected a mapping of keys, found {type_name(data)}")
        raise SpecError([problem], origin)
    # The spec keeps none of the caller's containers: a later change to them cannot reach it.
    data, override_origin, override_problems = apply_overrides(copy.deepcopy(data), overrides or {})
    chk = ProblemCollector(origin, marks or {}, override_origin)
    chk.problems.extend(override_problems)
    chk.unknown_keys(data, section_keys(""), (), "the pipeline")

    def base_for(path: tuple) -> Path:
        return Path.cwd() if any(path[: n] in override_origin for n in range(1, len(path) + 1)) else base

    version, name, backend, parity = check_identity(chk, data, origin)
    source = check_source(chk, data, base_for, check_paths=check_sources)
    batch_size = check_int(chk, data, KEYS["batch_size"])
    seed = check_int(chk, data, KEYS["seed"])
    decode = chk.mapping(data.get("decode"), ("decode",), "the decode step") or {}
    chk.unknown_keys(decode, section_keys("decode"), ("decode",), "decode")
    decode_device = check_choice(chk, decode, KEYS["decode.device"])
    ops = check_all_ops(chk, data, required="views" not in data)
    views = check_views(chk, data, ops)
    outputs = check_outputs(chk, data)
    check_views_outputs(chk, outputs, data.get("views"))
    label_smoothing = check_target(chk, data, outputs, ops if isinstance(data.get("ops"), list) else [])
    loader = check_loader(chk, data)
    if loader.shuffle == "shards" and source.type != "webdataset":
        chk.add(("loader", "shuffle"), f"'shards' needs a webdataset source (the order shuffles shards); "
                                       f"this source is a {source.type}: use true for a global shuffle")
    if views and loader.executor == "ray":
        chk.add(("loader", "executor"), "'ray' runs pipelines of one image per sample; a pipeline with views runs "
                                        "on this host's workers: use processes or threads")
    if chk.problems:
        raise SpecError(chk.problems, origin)
    return PipelineSpec(version=version, name=name, backend=backend, source=source, batch_size=batch_size,
                        seed=seed, decode_device=decode_device, ops=tuple(ops), outputs=tuple(outputs),
                        loader=loader, parity=parity, label_smoothing=label_smoothing, views=views, origin=origin)


def load_spec(path: str | Path, overrides: Mapping[str, Any] | Iterable[str] | None = None, *,
              check_sources: bool = False) -> PipelineSpec:
    """Read and validate a pipeline file, or the shipped pipeline ``path`` names when it is no file
    (``load_spec("imagenet_train")``; a local file of the same name wins).

    ``overrides`` is a mapping of dotted key paths to values (``{"batch_size": 32}``) or a list of
    ``KEY=VALUE`` strings as given to ``--set``. ``check_sources=True`` makes a source folder, file
    list, shard or manifest that does not exist a problem too, positioned and with a did-you-mean
    (``dali-bridge validate`` does so unless ``--no-source-check``). Raises :class:`SpecError`
    listing every problem (file, line, column, key path, expected and found), or ``FileNotFoundError``
    (neither a file nor a shipped pipeline: with a did-you-mean over the shipped names).
    """
    path = resolve_pipeline(path).path
    try:
        text = decode_utf8(path.read_bytes(), str(path))
    except NotUtf8Error as exc:
        raise SpecError([Problem(exc.where, "<file>", exc.detail)], str(path)) from None
    data = read_yaml(text, str(path))[0]
    if overrides is not None and not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    return spec_from_dict(data, origin=str(path), base_dir=path.resolve().parent, overrides=overrides,
                          marks=positions(text, str(path)), check_sources=check_sources)


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


def _source_collector(path: str | Path, overrides: Mapping[str, Any] | None) -> ProblemCollector:
    """A collector that places problems at the file's ``source`` keys (or the ``--set`` that set them);
    ``path`` as :func:`load_spec` takes it (a shipped pipeline's name too)."""
    path = resolve_pipeline(path).path
    marks = positions(path.read_text(encoding="utf-8"), str(path))
    override_origin = apply_overrides({}, overrides or {})[1]
    return ProblemCollector(str(path), marks, override_origin)


def missing_source_warnings(spec: PipelineSpec, path: str | Path,
                            overrides: Mapping[str, Any] | None = None) -> list[str]:
    """The source-path problems of :func:`load_spec` ``check_sources=True`` as warnings, for a file
    validated away from its data (``validate --no-source-check``): the data may be mounted later."""
    chk = _source_collector(path, overrides)
    check_source_paths(chk, {"root": spec.source.root, "file_list": spec.source.file_list,
                              "manifest": spec.source.manifest, "shards": spec.source.shards})
    return [str(problem) for problem in chk.problems]


def positioned_source_problems(path: str | Path, found: Iterable[tuple[str, str]],
                               overrides: Mapping[str, Any] | None = None) -> SpecError | None:
    """``found`` — (``source`` key, message) pairs a check of the source's data made, such as
    :func:`dali_bridge.data.sources.source_check.source_problems` through the store — as one
    :class:`SpecError` whose problems sit at those keys of the file ``path`` (``file:line:column``,
    or the ``--set`` that set them), of kind :data:`~dali_bridge.spec.problems.MISSING_SOURCE`;
    None when there is none."""
    found = list(found)
    if not found:
        return None
    chk = _source_collector(path, overrides)
    for key, message in found:
        chk.add(("source", key), message, MISSING_SOURCE)
    return SpecError(chk.problems, str(path))
