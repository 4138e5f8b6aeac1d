"""timm's training arguments (train.py's data and augmentation options) as a pipeline, without timm.

The pipeline is what timm's ``transforms_imagenet_train`` and train.py build from the arguments:
``RandomResizedCropAndInterpolation(size, scale, ratio, interpolation)`` (timm's default ``random``: the
crop's ``interpolation: random``), flips, the ``--aa`` policy (``rand-*``: timm's RandAugment, the
``rand_augment`` op's ``variant: timm``; ``augmix-*``: ``timm_augmix``; ``original``, ``originalr``,
``v0``, ``v0r``, ``3a``: ``timm_auto_augment``; fill the mean colour as timm's ``img_mean``; a fixed
``--train-interpolation`` as its ``interpolation``, as timm passes it on), ``ColorJitter(cj, cj, cj)``
only without ``--aa`` or with ``3a`` (timm disables it otherwise; in a ``RandomApply`` of
``--color-jitter-prob``: its ``probability``), ``RandomGrayscale``, ``RandomApply([GaussianBlur(23)],
p=--gaussian-blur-prob)``, ``Normalize``, timm's
``RandomErasing`` (``--remode pixel``: per-pixel normal noise, ``const``: zeros; area [0.02, 1/3],
aspect [0.3, 1/0.3]), then ``Mixup`` on the batch (``--mixup``, ``--cutmix``,
``--mixup-prob``, ``--mixup-switch-prob``) with ``--smoothing`` in the targets, and
``--aug-repeats`` as ``loader.repeated_augmentations``. Defaults are train.py's. Anything with no
op yet is refused by name, with what to do.
"""
from __future__ import annotations

import argparse
import difflib
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import RecipeError
from .spec_data import build_spec

if TYPE_CHECKING:
    from ..spec.pipeline import PipelineSpec

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # timm.data.constants.IMAGENET_DEFAULT_MEAN / _STD
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_SIZE = 224  # timm's default input size (3, 224, 224); a model's own default may differ
ERASE_SCALE = [0.02, 1.0 / 3.0]  # timm's RandomErasing min_area, max_area
ERASE_RATIO = [0.3, 1.0 / 0.3]  # its min_aspect and 1 / min_aspect
TIMM_POLICIES = ("original", "originalr", "v0", "v0r", "3a")  # timm's auto_augment_policy names
FILTERS = ("nearest", "bilinear", "bicubic")


def _parser() -> argparse.ArgumentParser:
    """timm train.py's data and augmentation options, with its defaults."""
    p = argparse.ArgumentParser(prog="from_timm", add_help=False, exit_on_error=False, allow_abbrev=False)
    number, numbers = dict(type=float), dict(type=float, nargs="+")
    p.add_argument("--input-size", type=int, nargs=3, default=None)
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--mean", **numbers, default=None)
    p.add_argument("--std", **numbers, default=None)
    p.add_argument("--interpolation", default="")
    p.add_argument("--train-interpolation", default="random")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--scale", **numbers, default=[0.08, 1.0])
    p.add_argument("--ratio", **numbers, default=[3.0 / 4.0, 4.0 / 3.0])
    p.add_argument("--hflip", **number, default=0.5)
    p.add_argument("--vflip", **number, default=0.0)
    p.add_argument("--color-jitter", **number, default=0.4)
    p.add_argument("--grayscale-prob", **number, default=None)
    p.add_argument("--color-jitter-prob", **number, default=None)
    p.add_argument("--gaussian-blur-prob", **number, default=None)
    p.add_argument("--aa", default=None)
    p.add_argument("--aug-repeats", **number, default=0)
    p.add_argument("--aug-splits", type=int, default=0)
    p.add_argument("--jsd-loss", action="store_true")
    p.add_argument("--no-aug", action="store_true")
    p.add_argument("--train-crop-mode", default=None)
    p.add_argument("--reprob", **number, default=0.0)
    p.add_argument("--remode", default="pixel")
    p.add_argument("--recount", type=int, default=1)
    p.add_argument("--resplit", action="store_true")
    p.add_argument("--mixup", **number, default=0.0)
    p.add_argument("--cutmix", **number, default=0.0)
    p.add_argument("--cutmix-minmax", **numbers, default=None)
    p.add_argument("--mixup-prob", **number, default=1.0)
    p.add_argument("--mixup-switch-prob", **number, default=0.5)
    p.add_argument("--mixup-mode", default="batch")
    p.add_argument("--mixup-off-epoch", type=int, default=0)
    p.add_argument("--smoothing", **number, default=0.1)
    return p


def _option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every option string -> its dest."""
    return {option: action.dest for action in parser._actions for option in action.option_strings}


def _unknown(found: Sequence[str], parser: argparse.ArgumentParser) -> RecipeError:
    known = sorted(o for o in _option_names(parser) if o.startswith("--"))
    problems = []
    for name in found:
        bare = {option.lstrip("-"): option for option in known}  # the dashes every option shares say nothing
        hint = [bare[h] for h in difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.75)]
        problems.append(f"{name}: not one of timm's data arguments from_timm reads"
                        + (f"; did you mean {hint[0]}?" if hint else ""))
    problems.append(f"from_timm reads: {', '.join(known)} (leave out the others, e.g. --model, --lr)")
    return RecipeError(problems, "from_timm")


def _typed(action: argparse.Action, value: Any) -> Any:
    """A mapping's value as the option's argparse type makes it (lists for options taking several)."""
    if value is None or action.type is None:
        return value
    if action.nargs not in (None, "?"):
        return [action.type(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return action.type(value)


def _namespace_of(args: Mapping[str, Any], parser: argparse.ArgumentParser) -> argparse.Namespace:
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    namespace = parser.parse_args([])
    unknown, problems = [], []
    for key, value in args.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in actions:
            unknown.append("--" + dest.replace("_", "-"))
            continue
        try:
            setattr(namespace, dest, _typed(actions[dest], value))
        except (TypeError, ValueError):
            problems.append(f"{key}: expected {getattr(actions[dest].type, '__name__', 'a value')}"
                            f"{' values' if actions[dest].nargs not in (None, '?') else ''}, found {value!r}")
    if unknown:
        raise _unknown(unknown, parser)
    if problems:
        raise RecipeError(problems, "from_timm")
    return namespace


def parse_timm_args(args: str | Sequence[str] | Mapping[str, Any]) -> argparse.Namespace:
    """timm's arguments as train.py parses them (its defaults filled in): a command-line string, a list
    of strings, or a mapping of the same names (``"color-jitter"``, ``"color_jitter"`` or ``"--color-jitter"``)."""
    parser = _parser()
    if isinstance(args, Mapping):
        return _namespace_of(args, parser)
    words = shlex.split(args) if isinstance(args, str) else [str(word) for word in args]
    try:
        namespace, rest = parser.parse_known_args(words)
    except argparse.ArgumentError as exc:
        raise RecipeError([str(exc)], "from_timm") from None
    if rest:
        raise _unknown([word for word in rest if word.startswith("-")] or rest, parser)
    return namespace


def _refusals(ns: argparse.Namespace) -> list[str]:
    """Options whose effect has no op yet, each with what to do."""
    found = []
    if ns.no_aug:
        found.append("--no-aug: timm then trains on Resize + CenterCrop; write those ops (resize, center_crop) instead")
    if ns.aug_splits or ns.jsd_loss or ns.resplit:
        found.append("--aug-splits/--jsd-loss/--resplit: augmentation splits (AugMix's JSD loss) give each sample "
                     "several views; the loader gives one per sample: leave them out")
    if ns.train_crop_mode not in (None, "rrc"):
        found.append(f"--train-crop-mode {ns.train_crop_mode}: only timm's 'rrc' (random_resized_crop) has an op")
    if ns.cutmix_minmax is not None:
        found.append("--cutmix-minmax: CutMix's box from a min/max ratio has no op (cutmix draws λ from Beta(α, α)): "
                     "give --cutmix ALPHA instead")
    if ns.mixup_off_epoch:
        found.append(f"--mixup-off-epoch {ns.mixup_off_epoch}: a pipeline mixes every epoch: build a second "
                     f"pipeline without mixing for the epochs after it")
    if ns.mixup_mode != "batch" and (ns.mixup > 0 or ns.cutmix > 0):
        found.append(f"--mixup-mode {ns.mixup_mode}: mixing draws one λ per batch (timm's 'batch'); per pair or per "
                     f"element has no op yet: use --mixup-mode batch")
    if ns.reprob > 0 and ns.recount != 1:
        found.append(f"--recount {ns.recount}: random_erasing erases one box per image: use --recount 1")
    if ns.reprob > 0 and ns.remode.lower() not in ("pixel", "const"):
        found.append(f"--remode {ns.remode}: random_erasing fills with per-pixel noise (timm's 'pixel') or a "
                     f"constant (timm's 'const'); timm's per-channel 'rand' has no op: use --remode pixel or const")
    if ns.aug_repeats and float(ns.aug_repeats) != int(ns.aug_repeats):
        found.append(f"--aug-repeats {ns.aug_repeats}: loader.repeated_augmentations repeats each sample a whole "
                     f"number of times: give an integer")
    return found


def _size(ns: argparse.Namespace) -> tuple[Any, list[str]]:
    if ns.input_size is not None:
        channels, height, width = ns.input_size
        if channels != 3:
            return None, [f"--input-size {channels} {height} {width}: the bridge decodes RGB (3 channels)"]
        return (height if height == width else [height, width]), []
    return (ns.img_size if ns.img_size is not None else DEFAULT_SIZE), []


def _channels(values: Any, default: tuple, option: str) -> tuple[list[float], list[str]]:
    values = list(default if values is None else values)
    if len(values) == 1:  # timm repeats one value for every channel
        values = values * 3
    if len(values) != 3:
        return list(default), [f"{option}: expected 1 or 3 values (R, G, B), found {len(values)}"]
    return [float(v) for v in values], []


def _filters(ns: argparse.Namespace, crop_interpolation: str | None) -> tuple[str | None, list[str]]:
    """timm's train interpolation (``random``: bilinear or bicubic per image, its default) and problems;
    ``crop_interpolation`` fixes the crop's filter where it is ``random`` (:func:`_crop_filter`)."""
    if crop_interpolation not in (None, "bilinear", "bicubic"):
        return None, [f"crop_interpolation {crop_interpolation!r}: expected one of timm's random choices, "
                      f"bilinear or bicubic"]
    mode = ns.train_interpolation or ns.interpolation  # train.py: empty means the data config's
    if not mode:
        return None, ["--train-interpolation '': timm then uses the model's default interpolation, which from_timm "
                      "cannot see: pass --interpolation bilinear|bicubic"]
    if mode != "random" and crop_interpolation not in (None, mode):
        return None, [f"crop_interpolation {crop_interpolation!r} contradicts --train-interpolation {mode}: it is "
                      f"for timm's 'random' only"]
    if mode not in ("random",) + FILTERS:
        return None, [f"--train-interpolation {mode}: random_resized_crop and timm's policies resample with "
                      f"{', '.join(FILTERS)} or random (timm's default)"]
    return mode, []


def rand_augment_params(config: str, fill: list[int]) -> tuple[dict[str, Any] | None, list[str]]:
    """timm's ``rand_augment_transform`` config (``rand-m9-mstd0.5-inc1``) as the rand_augment op's
    timm variant: m magnitude (default 10), n layers (2), mstd (0; above 100: uniform), inc; p and mmax
    only at timm's defaults (0.5, 10), no transform set (``t...``)."""
    params: dict[str, Any] = {"variant": "timm", "num_ops": 2, "magnitude": 10, "magnitude_std": 0.0,
                              "increasing": False, "fill": fill}
    problems = []
    for section in config.split("-")[1:]:
        if section.startswith("t"):
            problems.append(f"--aa {config}: section '{section}' (a weighted or other transform set) has no op; "
                            f"rand_augment's timm variant has timm's default set: leave it out")
            continue
        parts = re.split(r"(\d.*)", section)
        if len(parts) < 2:
            continue  # timm skips sections without a number
        key, value = parts[:2]
        try:
            if key == "m":
                params["magnitude"] = int(value)
            elif key == "n":
                params["num_ops"] = int(value)
            elif key == "mstd":
                params["magnitude_std"] = float("inf") if float(value) > 100 else float(value)
            elif key == "inc":
                params["increasing"] = params["increasing"] or bool(value)  # timm: bool("0") is True too
            elif key in ("p", "mmax") and float(value) != {"p": 0.5, "mmax": 10}[key]:
                problems.append(f"--aa {config}: '{section}' has no op (rand_augment's timm variant applies each "
                                f"layer with chance 0.5 and clips the magnitude to [0, 10]): leave it out")
            elif key not in ("p", "mmax"):
                problems.append(f"--aa {config}: unknown RandAugment section '{section}' (timm's: m, n, mstd, inc, p, "
                                f"mmax, t)")
        except ValueError:
            problems.append(f"--aa {config}: section '{section}' needs a number after '{key}'")
    return (None if problems else params), problems


def _sections(config: str, kind: str, readers: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """timm's ``-``-separated config sections (the first is the policy's name) read by key as timm
    reads them: a key, then a number (``re.split(r'(\\d.*)', ...)``); sections without one are skipped."""
    found, problems = {}, []
    for section in config.split("-")[1:]:
        parts = re.split(r"(\d.*)", section)
        if len(parts) < 2:
            continue  # as timm
        key, value = parts[:2]
        if key not in readers:
            problems.append(f"--aa {config}: unknown {kind} section '{section}' (timm's: {', '.join(readers)})")
            continue
        try:
            found[key] = readers[key](value)
        except ValueError:
            problems.append(f"--aa {config}: section '{section}' needs a number after '{key}'")
    return found, problems


def auto_augment_params(config: str, fill: list[int]) -> tuple[dict[str, Any] | None, list[str]]:
    """timm's ``auto_augment_transform`` config (``original-mstd0.5``) as the timm_auto_augment op."""
    sections, problems = _sections(config, "AutoAugment", {"mstd": float})
    params = {"policy": config.split("-")[0], "magnitude_std": sections.get("mstd", 0.0), "fill": fill}
    return (None if problems else params), problems


def augmix_params(config: str, fill: list[int]) -> tuple[dict[str, Any] | None, list[str]]:
    """timm's ``augment_and_mix_transform`` config (``augmix-m5-w4-d2``) as the timm_augmix op: m
    magnitude (default 3), w chains (3), d depth (-1: 1 to 3), a alpha (1.0), b blended, mstd (default
    infinite: uniform magnitudes)."""
    readers = {"mstd": float, "m": int, "w": int, "d": int, "a": float, "b": bool}  # timm: bool("0") is True too
    sections, problems = _sections(config, "AugMix", readers)
    names = {"mstd": "magnitude_std", "m": "magnitude", "w": "mixture_width", "d": "chain_depth", "a": "alpha",
             "b": "blended"}
    params = {"magnitude": 3, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "magnitude_std": float("inf"),
              "blended": False, "fill": fill} | {names[key]: value for key, value in sections.items()}
    return (None if problems else params), problems


def _policy(aa: str, interpolation: str | None, fill: list[int]) -> tuple[dict | None, list[str]]:
    """The ``--aa`` op, or why it has none."""
    name = aa.split("-")[0]
    kinds = {"rand": ("RandAugment", "rand_augment", rand_augment_params),
             "augmix": ("AugMix", "timm_augmix", augmix_params)}
    kinds.update({policy: ("AutoAugment", "timm_auto_augment", auto_augment_params) for policy in TIMM_POLICIES})
    if name not in kinds and not aa.startswith("rand"):
        return None, [f"--aa {aa}: not a timm policy (timm knows rand-*, augmix-*, {', '.join(TIMM_POLICIES)}; "
                      f"its create_transform fails on others: 'Unknown AA policy'); torchvision's TrivialAugmentWide "
                      f"is the trivial_augment_wide op: from_torchvision with v2.TrivialAugmentWide()"]
    _, op, read = kinds["rand" if aa.startswith("rand") else name]
    params, problems = read(aa, fill)
    if params and interpolation not in (None, "random"):  # timm passes a fixed one on; random is its default
        params["interpolation"] = interpolation
    return ({op: params} if params else None), problems


def _mixing(ns: argparse.Namespace) -> dict[str, Any] | None:
    """timm's ``Mixup`` (batch mode): both alphas switch by ``--mixup-switch-prob``; ``--mixup-prob`` per batch."""
    if ns.mixup > 0 and ns.cutmix > 0:
        return {"batch_mix": {"mixup_alpha": ns.mixup, "cutmix_alpha": ns.cutmix,
                              "cutmix_probability": ns.mixup_switch_prob, "probability": ns.mixup_prob}}
    for kind, alpha in (("mixup", ns.mixup), ("cutmix", ns.cutmix)):
        if alpha > 0:
            if ns.mixup_prob == 1.0:
                return {kind: {"alpha": alpha}}
            return {"batch_mix": {f"{kind}_alpha": alpha, "cutmix_probability": 1.0 if kind == "cutmix" else 0.0,
                                  "probability": ns.mixup_prob}}
    return None


def _ops(ns: argparse.Namespace, crop_interpolation: str | None) -> tuple[list[tuple[dict, str]], list[str]]:
    """(op, the arguments it came from) in timm's order, and every problem."""
    problems = _refusals(ns)
    size, found = _size(ns)
    mean, mean_problems = _channels(ns.mean, IMAGENET_MEAN, "--mean")
    std, std_problems = _channels(ns.std, IMAGENET_STD, "--std")
    interpolation, filter_problems = _filters(ns, crop_interpolation)
    problems += found + mean_problems + std_problems + filter_problems
    crop_filter = crop_interpolation if interpolation == "random" and crop_interpolation else interpolation
    ops: list[tuple[dict, str]] = [({"random_resized_crop": {"size": size, "scale": ns.scale, "ratio": ns.ratio,
                                                             "interpolation": crop_filter or "bilinear"}},
                                    "--input-size/--scale/--ratio/--train-interpolation")]
    if ns.hflip > 0:
        ops.append(({"horizontal_flip": {"probability": ns.hflip}}, "--hflip"))
    if ns.vflip > 0:
        ops.append(({"vertical_flip": {"probability": ns.vflip}}, "--vflip"))
    if ns.aa:
        fill = [min(255, round(255 * m)) for m in mean]  # timm's img_mean: the fill colour of its operations
        policy, policy_problems = _policy(ns.aa, interpolation, fill)
        problems += policy_problems
        if policy:
            ops.append((policy, "--aa"))
    if ns.color_jitter and (not ns.aa or "3a" in ns.aa):  # timm drops colour jitter when --aa is set, but for 3a
        jitter = float(ns.color_jitter)
        params = {"brightness": jitter, "contrast": jitter, "saturation": jitter}
        if ns.color_jitter_prob is not None:  # timm's RandomApply([ColorJitter(...)], p=color_jitter_prob)
            params["probability"] = ns.color_jitter_prob
        ops.append(({"color_jitter": params}, "--color-jitter/--color-jitter-prob"))
    if ns.grayscale_prob:
        ops.append(({"random_grayscale": {"probability": ns.grayscale_prob}}, "--grayscale-prob"))
    if ns.gaussian_blur_prob:  # timm's RandomApply([GaussianBlur(kernel_size=23)], p): torchvision's sigma range
        ops.append(({"gaussian_blur": {"kernel_size": 23, "sigma": [0.1, 2.0], "probability": ns.gaussian_blur_prob}},
                    "--gaussian-blur-prob"))
    ops.append(({"normalize": {"mean": mean, "std": std}}, "--mean/--std"))
    if ns.reprob > 0:
        value = "random" if ns.remode.lower() == "pixel" else 0.0
        ops.append(({"random_erasing": {"probability": ns.reprob, "scale": ERASE_SCALE, "ratio": ERASE_RATIO,
                                        "value": value}}, "--reprob/--remode"))
    mixing = _mixing(ns)
    if mixing:
        ops.append((mixing, "--mixup/--cutmix/--mixup-prob/--mixup-switch-prob"))
    return ops, problems


def from_timm(args: str | Sequence[str] | Mapping[str, Any], *, source: str | Path | Mapping[str, Any],
              batch_size: int | None = None, crop_interpolation: str | None = None, name: str = "from-timm",
              overrides: Mapping[str, Any] | None = None) -> "PipelineSpec":
    """The :class:`~dali_bridge.spec.pipeline.PipelineSpec` of timm's training arguments (see the module docstring).

    ``args``: a command-line string, a list, or a mapping of the same names. ``batch_size``: default
    the arguments' ``-b/--batch-size`` (train.py's 128). ``crop_interpolation``: a fixed filter for the crop
    where timm's is ``random`` (its default, which picks bilinear or bicubic per image, as the crop's
    ``interpolation: random`` does without it). ``overrides``: dotted
    keys as :func:`~dali_bridge.load_spec` takes them. Raises :class:`RecipeError` listing every
    argument with no op yet. ``spec.to_yaml()`` is the pipeline file."""
    ns = parse_timm_args(args)
    ops, problems = _ops(ns, crop_interpolation)
    if problems:
        raise RecipeError(problems, "from_timm")
    loader = {"repeated_augmentations": int(ns.aug_repeats)} if ns.aug_repeats and ns.aug_repeats >= 1 else None
    return build_spec([op for op, _ in ops], [label for _, label in ops], source=source,
                      batch_size=batch_size if batch_size is not None else ns.batch_size, name=name,
                      origin="from_timm", label_smoothing=ns.smoothing, loader=loader, overrides=overrides)
