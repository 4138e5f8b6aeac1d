"""The pipeline reference page (``docs/pipeline-reference.md``), generated so it cannot drift:
the ops, their parameters, defaults and backends come from the op registry (:data:`ops.OPS`); the
keys' choices and defaults from the constants and dataclasses of :mod:`dali_bridge.spec`.

    python -m dali_bridge.spec.reference                 # print the page
    python -m dali_bridge.spec.reference --write PATH    # write it
    python -m dali_bridge.spec.reference --check PATH    # exit 1 when PATH differs from the registry's page
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from ..ops import base as op_base
from . import model as spec_model
from ..ops.registry import OPS
from ..ops.registry import op_origin

# Only ``OPS`` and each op's ``name``, ``doc``, ``params`` (``name``, ``default``, ``doc``),
# ``backends`` and ``primary`` are read (and where an op from another package came from), so the
# registry's inner layout may change freely.
_REQUIRED = op_base.REQUIRED

DEFAULT_PATH = Path("docs/pipeline-reference.md")


def _value(value: Any) -> str:
    """A default as it is written in a pipeline file (YAML flow style)."""
    if value is _REQUIRED:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _choices(values: Sequence[str]) -> str:
    return " \\| ".join(f"`{v}`" for v in values)


def _key_rows() -> list[tuple[str, str, str]]:
    """(key, choices or type, default) for every key a pipeline file may hold, with its meaning."""
    s, source, loader = spec_model, spec_model.SourceSpec(type="folder"), spec_model.LoaderSpec()
    return [
        ("version", f"integer, `{s.FORMAT_VERSION}`", "required", "the pipeline format version"),
        ("name", "string", "the file's name", "shown in logs, tables and errors"),
        ("backend", _choices(s.BACKENDS), "`auto`",
         "`dali` (GPU), `dali-cpu` (DALI, every op on the CPU), `torchvision` (DataLoader fallback); `auto`: "
         "`dali` when DALI imports and a CUDA device is usable, else `torchvision` (the reason is logged)"),
        ("source.type", _choices(s.SOURCE_TYPES), "required",
         "`folder`: ImageFolder layout, sorted sub-folder names are the classes; `file_list`: a text file of "
         "`path label` lines; `webdataset`: tar shards ([WebDataset](webdataset.md)); `parquet`: Parquet files "
         "such as Hugging Face image datasets ([From your code](from-your-code.md#parquet-and-hugging-face-image-"
         "datasets))"),
        ("source.root", "path", "required for `folder`",
         "`folder`: the folder of class sub-folders; `file_list`: base of relative paths in the list "
         "(default: the list's folder). Relative paths resolve against the pipeline file's folder"),
        ("source.file_list", "path", "required for `file_list`",
         "the list file; blank lines and `#` comments are skipped, the label is the last field"),
        ("source.extensions", "list of strings", f"`{_value(list(source.extensions))}`",
         "files with other extensions are ignored, counted and reported"),
        ("source.shards", "brace pattern", "required for `webdataset`", "e.g. `shards/train-{000000..000127}.tar`"),
        ("source.image_key", "string or list", f"`{';'.join(source.image_keys)}`",
         "the image member's extension; the first present wins"),
        ("source.label_key", "string", f"`{source.label_key}`", "the member holding the integer label as text"),
        ("source.manifest", "path", "`<prefix>.manifest.json` if present",
         "class names and label mapping written by `dali-bridge convert`"),
        ("source.files", "path, glob or brace pattern, or a list of them", "required for `parquet`",
         "the Parquet files, in order (each glob sorted); samples are their rows, file by file"),
        ("source.image_column", "string", f"`{source.image_column}`",
         "`parquet`: the encoded images: Hugging Face's `{bytes, path}` image struct or a binary column"),
        ("source.label_column", "string", f"`{source.label_column}`",
         "`parquet`: the integer labels; class names from the file's Hugging Face `ClassLabel` names when present"),
        ("source.storage_options", "mapping", "`{}`",
         "shards or Parquet files at a URL: fsspec's non-secret client settings (credentials come from the "
         "environment; "
         "[Object storage](object-storage.md))"),
        ("source.max_requests", "integer >= 1", f"`{source.max_requests}`",
         "shards or Parquet files at a URL: ranged GETs in flight per process"),
        ("source.timeout", "seconds in (0, 3600]", f"`{source.timeout:g}`",
         "shards or Parquet files at a URL: the time one sample's read may take, retries included; then it is a "
         "sample error"),
        ("source.cache", "`{dir: path, max_bytes: size}`", "none (ranged reads)",
         "shards at a URL: download each shard whole on first touch into a node-wide cache bounded by "
         "`max_bytes` (bytes, or text like `200GB`), least recently used evicted"),
        ("source.max_pixels", "integer >= 1", f"`{source.max_pixels}`",
         "images whose header claims more pixels (height × width) are refused before decoding, as a sample error "
         "that follows `loader.on_error` (PIL's limit; raise it for larger images)"),
        ("source.max_bytes", "integer >= 1", f"`{source.max_bytes}` (256 MiB)",
         "image files (or shard members) larger than this many bytes are refused before they are read, as a "
         "sample error that follows `loader.on_error` (the cap `dali-bridge convert` packs files under)"),
        ("batch_size", "integer >= 1", "required", "samples per batch"),
        ("seed", f"integer from 0 to {s.MAX_SEED}", "`0`",
         "with the epoch, decides the order and every random parameter (the draws use 32 bits, so larger seeds "
         "are refused rather than repeat a smaller one's augmentations)"),
        ("decode.device", _choices(s.DECODE_DEVICES), "`mixed`",
         "`dali` backend only: `mixed` decodes with nvJPEG on the GPU, `cpu` on the CPU (ops still on the GPU)"),
        ("parity", _choices(s.PARITY), "`exact`",
         "how the DALI backends resample: `exact` reproduces torchvision's `F.resize`, `fast` uses DALI's plain "
         "resize ([Equivalence](equivalence.md#parity-exact-or-fast))"),
        ("ops", f"list of at most {s.MAX_OPS} ops", "required",
         "the ops below, in order; the output size must be fixed"),
        ("outputs", f"list of {_choices(s.OUTPUTS)}", "`[image, label]`",
         "what each batch tuple holds, in this order: `image`, `label` (int64), `index` (int64, position in the "
         "source listing), `valid` (bool, false for `pad` repeats), `target` (float32 [N, number of classes]: "
         "soft targets, one-hot with `target.label_smoothing` and batch mixing folded in; required with "
         "`mixup`, `cutmix` or `batch_mix`)"),
        ("target.label_smoothing", "number in [0, 1)", "`0`",
         "with the `target` output only: targets are `(1 - ε) · one_hot + ε / number of classes` before mixing, "
         "as `CrossEntropyLoss(label_smoothing=ε)` computes them (so leave the loss's own smoothing at 0)"),
        ("loader.workers", "integer >= 0 or `auto`", "`auto`",
         "DALI threads or DataLoader worker processes; `auto`: this rank's share of the cores available "
         "(cores ÷ processes on this node; `dali-bridge show` prints the figure and why); `0` runs torchvision "
         "in the main process"),
        ("loader.prefetch", "integer >= 1", f"`{loader.prefetch}`", "batches prepared ahead"),
        ("loader.executor", _choices(s.EXECUTORS), f"`{loader.executor}`",
         "how the `torchvision` backend runs its workers: DataLoader worker processes, or threads of the "
         "loader's process (nothing pickled, no shared memory, no worker start-up; the same batches); on "
         "`dali-cpu`, how the ops that run in torch after the DALI graph (the policies, colour jitter) run: "
         "in worker processes, or threads; DALI runs its own threads"),
        ("loader.last_batch", _choices(s.LAST_BATCH), f"`{loader.last_batch}`",
         "`partial`: every sample once, the last batch may be smaller; `drop`: full batches only; `pad`: full "
         "batches, the shortfall repeated from the epoch's start and marked `valid: false`"),
        ("loader.on_error", _choices(s.ON_ERROR), f"`{loader.on_error}`",
         "at an unreadable sample: stop with its index, file and reason, or leave it out, count and log it "
         "([Errors](errors.md))"),
        ("loader.shuffle", "`true` \\| `false` \\| `shards`", f"`{_value(loader.shuffle)}`",
         "`false` keeps the listing order (validation); `shards` (webdataset): shards shuffled, then samples "
         "within a window of shards ([Object storage](object-storage.md#a-shard-aware-order))"),
        ("loader.shuffle_window", "integer >= 1", f"`{loader.shuffle_window}`",
         "`shuffle: shards`: how many shards' samples are shuffled together; `dali-bridge show --order` "
         "measures how well a window mixes classes"),
        ("loader.repeated_augmentations", f"integer from 1 to {s.MAX_REPEATED_AUGMENTATIONS}",
         f"`{loader.repeated_augmentations}`",
         "each sample comes this many times per epoch, each time with its own random parameters; the repeats "
         "follow one another in the epoch's order before it is dealt to ranks (torchvision's `RASampler`), so "
         "they land on different ranks; `len()` and every `last_batch` policy count `samples × r`"),
        ("loader.report_starvation", "`true` \\| `false`", f"`{_value(loader.report_starvation)}`",
         "log at each epoch's end whether training waited for data (data-bound, a warning, with what to try) or "
         "not (compute-bound); the figures: `loader.stats()` ([The loader](loader.md#is-the-gpu-starving))"),
    ]


def documented_keys() -> list[str]:
    """Every dotted key the page documents."""
    return [row[0] for row in _key_rows()]


def _op_section(op: Any) -> list[str]:
    every_backend = set(spec_model.BACKENDS) - {"auto"}
    backends = "all backends" if set(op.backends) == every_backend else ", ".join(f"`{b}`" for b in op.backends)
    lines = [f"### `{op.name}`", "", op.doc, "", f"Runs on {backends}."]
    origin = op_origin(op.name)
    if origin is not None:
        lines.append(f"From the {origin}, not dali-bridge itself.")
    if getattr(op, "primary", None):
        lines.append(f"Shorthand: `- {op.name}: VALUE` sets `{op.primary}`.")
    lines += ["", "| parameter | default | meaning |", "|---|---|---|"]
    lines += [f"| `{p.name}` | {_value(p.default)} | {p.doc} |" for p in op.params]
    return lines + [""]


def render_reference() -> str:
    """The page's markdown."""
    lines = ["# Pipeline reference", "",
             "<!-- Generated by `python -m dali_bridge.spec.reference --write docs/pipeline-reference.md` from the op "
             "registry and the spec's keys; edit those, not this page. -->", "",
             "A pipeline file is YAML ([how to write one](pipeline-file.md)). Sizes are in pixels (`224` is "
             "224×224, `[h, w]` is height, width); mean and std in [0, 1] units as in torchvision.", "",
             "## Keys", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {kind} | {default} | {meaning} |" for key, kind, default, meaning in _key_rows()]
    lines += ["", "## Ops", "",
              "An op is written `- name: {param: value}`; `- name: value` sets its main parameter, `- name` "
              "alone takes the defaults. Ops come in this order: ops on uint8 images; one finishing op (`normalize`, "
              "`crop_mirror_normalize`; without one, batches are uint8 CHW); ops on the normalised float images "
              "(`random_erasing`); at most one batch-level op (`mixup`, `cutmix`, `batch_mix`), which needs the "
              "`target` output. Ops after the finish run on the batch on the loader's device, the same for every "
              "backend.", ""]
    for name in sorted(OPS):
        lines += _op_section(OPS[name])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dali_bridge.spec.reference", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", help="write the page to PATH")
    group.add_argument("--check", metavar="PATH", help="exit 1 when PATH is not the page the registry gives")
    args = parser.parse_args(argv)
    page = render_reference()
    if args.write:
        Path(args.write).write_text(page)
    elif args.check:
        path = Path(args.check)
        if not path.is_file() or path.read_text() != page:
            print(f"{path} is out of date with the op registry: "
                  f"run python -m dali_bridge.spec.reference --write {path}",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
