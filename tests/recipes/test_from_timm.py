"""from_timm: timm's training arguments (train.py's data and augmentation options, its defaults)
become the ops timm's transforms_imagenet_train and train.py's Mixup would apply; what has no op
yet is refused by name with what to do. timm itself is not needed."""
from __future__ import annotations

import math

import pytest

from dali_bridge import from_timm
from dali_bridge.cli import main as cli
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.errors import RecipeError
from dali_bridge.recipes.from_timm import parse_timm_args

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TIMM_FILL = [124.0, 116.0, 104.0]  # timm's img_mean: round(255 * mean), the fill of its RandAugment


def ops_of(spec) -> list:
    return [(op.name, dict(op.params)) for op in spec.ops]


def convert(args, **kwargs):
    kwargs.setdefault("crop_interpolation", "bilinear")
    return from_timm(args, source="data", **kwargs)


def test_train_pys_defaults_are_crop_flip_colour_jitter_normalize_and_label_smoothing():
    spec = convert("")
    names = [name for name, _ in ops_of(spec)]
    assert names == ["random_resized_crop", "horizontal_flip", "color_jitter", "normalize"]
    crop, flip, jitter, finish = (params for _, params in ops_of(spec))
    assert (crop["size"], crop["scale"], crop["ratio"]) == (224, [0.08, 1.0], [0.75, 4 / 3])
    assert crop["interpolation"] == "bilinear" and crop["antialias"] is True
    assert flip == {"probability": 0.5}
    assert jitter == {"brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": None,
                      "probability": 1.0}
    assert (finish["mean"], finish["std"]) == (MEAN, STD)
    assert spec.outputs == ("image", "target") and spec.label_smoothing == 0.1 and spec.batch_size == 128


def test_the_rand_augment_recipe_maps_to_timms_variant_with_timms_fill_and_erasing():
    spec = convert("--aa rand-m9-mstd0.5-inc1 --reprob 0.25 --remode pixel --hflip 0.4 --vflip 0.1")
    names = [name for name, _ in ops_of(spec)]
    assert names == ["random_resized_crop", "horizontal_flip", "vertical_flip", "rand_augment", "normalize",
                     "random_erasing"]  # timm drops colour jitter when --aa is set
    rand = dict(ops_of(spec))["rand_augment"]
    assert {k: rand[k] for k in ("variant", "num_ops", "magnitude", "magnitude_std", "increasing", "fill")} == {
        "variant": "timm", "num_ops": 2, "magnitude": 9, "magnitude_std": 0.5, "increasing": True, "fill": TIMM_FILL}
    assert dict(ops_of(spec))["random_erasing"] == {"probability": 0.25, "scale": [0.02, 1 / 3],
                                                    "ratio": [0.3, 1 / 0.3], "value": "random"}
    assert dict(ops_of(spec))["vertical_flip"] == {"probability": 0.1}


@pytest.mark.parametrize("config, expected", [
    ("rand-m9-mstd0.5-inc1", {"magnitude": 9, "num_ops": 2, "magnitude_std": 0.5, "increasing": True}),
    ("rand-m7-n3", {"magnitude": 7, "num_ops": 3, "magnitude_std": 0.0, "increasing": False}),
    ("rand-n1", {"magnitude": 10, "num_ops": 1, "magnitude_std": 0.0, "increasing": False}),  # timm's m default: 10
    ("rand-m9-mstd101", {"magnitude": 9, "num_ops": 2, "magnitude_std": math.inf, "increasing": False}),
    ("rand-m9-inc0", {"magnitude": 9, "num_ops": 2, "magnitude_std": 0.0, "increasing": True}),  # timm: bool("0")
    ("rand-m9-p0.5-mmax10", {"magnitude": 9, "num_ops": 2, "magnitude_std": 0.0, "increasing": False}),
])
def test_rand_augment_configs_read_as_timm_reads_them(config, expected):
    rand = dict(ops_of(convert(["--aa", config])))["rand_augment"]
    assert {key: rand[key] for key in expected} == expected


@pytest.mark.parametrize("config, message", [
    ("rand-m9-p0.3", "'p0.3' has no op"),
    ("rand-m9-mmax5", "'mmax5' has no op"),
    ("rand-m9-tweights", "section 'tweights'"),
    ("rand-m9-x3", "unknown RandAugment section 'x3'"),
])
def test_rand_augment_sections_without_an_op_are_refused(config, message):
    with pytest.raises(RecipeError, match=message):
        convert(["--aa", config])


@pytest.mark.parametrize("config, expected", [
    ("original", {"policy": "original", "magnitude_std": 0.0}),
    ("original-mstd0.5", {"policy": "original", "magnitude_std": 0.5}),
    ("originalr", {"policy": "originalr", "magnitude_std": 0.0}),
    ("v0", {"policy": "v0", "magnitude_std": 0.0}),
    ("v0r-mstd1", {"policy": "v0r", "magnitude_std": 1.0}),
    ("3a", {"policy": "3a", "magnitude_std": 0.0}),
    ("v0-mstd", {"policy": "v0", "magnitude_std": 0.0}),  # timm skips a section without a number
])
def test_timms_auto_augment_policies_map_to_timm_auto_augment_with_timms_fill(config, expected):
    ops = ops_of(convert(["--aa", config]))
    assert [name for name, _ in ops] == ["random_resized_crop", "horizontal_flip", "timm_auto_augment"] + (
        ["color_jitter"] if config == "3a" else []) + ["normalize"]  # timm keeps colour jitter for 3a only
    assert dict(ops)["timm_auto_augment"] == expected | {"interpolation": "random", "fill": TIMM_FILL}


@pytest.mark.parametrize("config, expected", [
    ("augmix-m5-w4-d2", {"magnitude": 5, "mixture_width": 4, "chain_depth": 2, "alpha": 1.0,
                         "magnitude_std": math.inf, "blended": False}),
    ("augmix", {"magnitude": 3, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "magnitude_std": math.inf,
                "blended": False}),
    ("augmix-m7-mstd0.5-a0.5-b1", {"magnitude": 7, "mixture_width": 3, "chain_depth": -1, "alpha": 0.5,
                                   "magnitude_std": 0.5, "blended": True}),
    ("augmix-b0", {"blended": True}),  # timm: bool("0") is True
])
def test_timms_augmix_configs_map_to_timm_augmix_as_timm_reads_them(config, expected):
    ops = dict(ops_of(convert(["--aa", config])))
    assert "color_jitter" not in ops and {key: ops["timm_augmix"][key] for key in expected} == expected
    assert ops["timm_augmix"]["fill"] == TIMM_FILL


@pytest.mark.parametrize("config, message", [
    ("original-m9", "unknown AutoAugment section 'm9' .timm's: mstd."),
    ("augmix-m5-p0.5", "unknown AugMix section 'p0.5'"),
    ("augmix-m5-w4.5", "section 'w4.5' needs a number after 'w'"),
    ("augmix-m12", r"--aa: magnitude: expected a magnitude \(an integer >= 0, at most 10"),
])
def test_policy_sections_timm_would_refuse_are_refused(config, message):
    with pytest.raises(RecipeError, match=message):
        convert(["--aa", config])


@pytest.mark.parametrize("config, op", [("rand-m7-mstd0.5-inc1", "rand_augment"), ("original", "timm_auto_augment"),
                                        ("augmix-m5", "timm_augmix"), ("3a", "timm_auto_augment")])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
def test_a_fixed_train_interpolation_is_the_crop_s_filter_and_every_policy_s(config, op, mode):
    ops = dict(ops_of(from_timm(["--train-interpolation", mode, "--aa", config], source="data")))
    assert ops["random_resized_crop"]["interpolation"] == mode and ops[op]["interpolation"] == mode


def test_timms_default_random_interpolation_is_the_crop_s_and_the_policies_random():
    ops = dict(ops_of(from_timm("--aa rand-m7-mstd0.5-inc1", source="data")))
    assert ops["random_resized_crop"]["interpolation"] == "random"
    assert ops["rand_augment"].get("interpolation") in (None, "random")  # null: timm's variant's default, random
    from dali_bridge.pipeline.plan import build_plan

    step = build_plan(from_timm("--aa rand-m7-mstd0.5-inc1", source="data")).steps[2]
    assert step.params["interpolation"] == "random"


@pytest.mark.parametrize("args, message", [
    ("--aa trivialaugment", "not a timm policy .*'Unknown AA policy'.*trivial_augment_wide op"),
    ("--mixup 0.8 --mixup-mode pair", "--mixup-mode pair: mixing draws one λ per batch"),
    ("--cutmix 1.0 --mixup-mode elem", "--mixup-mode elem"),
    ("--reprob 0.25 --remode rand", "--remode rand: .*per-channel 'rand' has no op"),
    ("--reprob 0.25 --recount 3", "--recount 3: random_erasing erases one box"),
    ("--cutmix-minmax 0.2 0.8", "--cutmix-minmax"),
    ("--mixup 0.2 --mixup-off-epoch 100", "--mixup-off-epoch 100"),
    ("--aug-repeats 1.5", "--aug-repeats 1.5: .*an integer"),
    ("--aug-splits 3 --jsd-loss", "--aug-splits"),
    ("--no-aug", "--no-aug"),
    ("--train-crop-mode rkrr", "--train-crop-mode rkrr"),
    ("--input-size 1 224 224", "the bridge decodes RGB"),
    ("--mean 0.5 0.5", "--mean: expected 1 or 3 values"),
])
def test_arguments_without_an_op_are_refused_by_name(args, message):
    with pytest.raises(RecipeError, match=message):
        convert(args)


def test_every_refusal_is_reported_at_once():
    with pytest.raises(RecipeError) as error:
        convert("--aa trivialaugment --mixup 0.8 --mixup-mode pair --reprob 0.3 --remode rand")
    assert len(error.value.problems) == 3


def test_crop_interpolation_fixes_only_the_crop_where_timms_is_random_and_bad_filters_are_refused():
    ops = dict(ops_of(from_timm("--aa augmix", source="data", crop_interpolation="bicubic")))
    assert ops["random_resized_crop"]["interpolation"] == "bicubic" and ops["timm_augmix"]["interpolation"] == "random"
    with pytest.raises(RecipeError, match="--train-interpolation lanczos: random_resized_crop and timm's policies "
                                          "resample with nearest, bilinear, bicubic or random"):
        from_timm("--train-interpolation lanczos", source="data")
    with pytest.raises(RecipeError, match="crop_interpolation 'nearest': expected one of timm's random choices"):
        from_timm("", source="data", crop_interpolation="nearest")
    with pytest.raises(RecipeError, match="contradicts --train-interpolation bilinear"):
        from_timm("--train-interpolation bilinear", source="data", crop_interpolation="bicubic")
    with pytest.raises(RecipeError, match="the model's default interpolation"):
        from_timm(["--train-interpolation", ""], source="data")
    crop = dict(ops_of(from_timm(["--train-interpolation", "", "--interpolation", "bicubic"], source="data")))
    assert crop["random_resized_crop"]["interpolation"] == "bicubic"


@pytest.mark.parametrize("args, expected", [
    ("--mixup 0.8 --cutmix 1.0", ("batch_mix", {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "cutmix_probability": 0.5,
                                                "probability": 1.0})),
    ("--mixup 0.8 --cutmix 1.0 --mixup-prob 0.6 --mixup-switch-prob 0.3",
     ("batch_mix", {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "cutmix_probability": 0.3, "probability": 0.6})),
    ("--mixup 0.2", ("mixup", {"alpha": 0.2})),
    ("--cutmix 1.0", ("cutmix", {"alpha": 1.0})),
    ("--cutmix 0.5 --mixup-prob 0.5",
     ("batch_mix", {"mixup_alpha": 0.2, "cutmix_alpha": 0.5, "cutmix_probability": 1.0, "probability": 0.5})),
])
def test_timms_mixup_arguments_become_the_batch_mixing_op(args, expected):
    spec = convert(args + " --smoothing 0.2")
    assert ops_of(spec)[-1] == expected
    assert spec.outputs == ("image", "target") and spec.label_smoothing == 0.2


def test_no_smoothing_and_no_mixing_outputs_hard_labels():
    spec = convert("--smoothing 0")
    assert spec.outputs == ("image", "label") and spec.label_smoothing == 0.0


def test_sizes_erasing_modes_repeats_and_batch_size():
    spec = convert("--input-size 3 160 192 --mean 0.5 --std 0.25 --reprob 0.5 --remode const --aug-repeats 3 -b 64")
    ops = dict(ops_of(spec))
    assert ops["random_resized_crop"]["size"] == [160, 192]
    assert (ops["normalize"]["mean"], ops["normalize"]["std"]) == ([0.5] * 3, [0.25] * 3)
    assert ops["random_erasing"]["value"] == 0.0  # timm's 'const' fills zeros
    assert spec.loader.repeated_augmentations == 3 and spec.batch_size == 64
    assert convert("--img-size 176 -b 64", batch_size=32).batch_size == 32  # the keyword wins
    assert dict(ops_of(convert("--img-size 176")))["random_resized_crop"]["size"] == 176
    assert dict(ops_of(convert("--color-jitter 0 --grayscale-prob 0.2"))).keys() == {
        "random_resized_crop", "horizontal_flip", "random_grayscale", "normalize"}


def test_a_string_a_list_and_a_mapping_of_the_same_arguments_give_the_same_pipeline():
    text = convert("--aa rand-m9-mstd0.5-inc1 --scale 0.35 1 --reprob 0.25 --mixup 0.8 --cutmix 1.0")
    listed = convert(["--aa", "rand-m9-mstd0.5-inc1", "--scale", "0.35", "1", "--reprob", "0.25", "--mixup", "0.8",
                      "--cutmix", "1.0"])
    mapped = convert({"aa": "rand-m9-mstd0.5-inc1", "scale": [0.35, 1.0], "reprob": 0.25, "--mixup": 0.8,
                      "cutmix": 1.0})
    assert text == listed == mapped


def test_options_from_timm_does_not_read_are_refused_with_a_did_you_mean():
    with pytest.raises(RecipeError) as error:
        convert("--model resnet50 --colour-jitter 0.3 --lr 0.1")
    assert error.value.problems[:3] == [
        "--model: not one of timm's data arguments from_timm reads",
        "--colour-jitter: not one of timm's data arguments from_timm reads; did you mean --color-jitter?",
        "--lr: not one of timm's data arguments from_timm reads"]
    with pytest.raises(RecipeError, match="--learning-rate: not one of timm's data arguments"):
        convert({"learning_rate": 0.1})


def test_parse_timm_args_keeps_train_pys_defaults():
    ns = parse_timm_args([])
    assert (ns.color_jitter, ns.reprob, ns.remode, ns.smoothing, ns.train_interpolation) == (
        0.4, 0.0, "pixel", 0.1, "random")
    assert (ns.mixup_prob, ns.mixup_switch_prob, ns.mixup_mode, ns.batch_size) == (1.0, 0.5, "batch", 128)


def test_the_cli_writes_the_pipeline_file_of_timms_arguments(tmp_path, capsys):
    assert cli.main(["from-timm", "--source", str(tmp_path), "--crop-interpolation", "bilinear", "--",
                     "--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--mixup", "0.8", "--cutmix", "1.0"]) == 0
    (tmp_path / "timm.yaml").write_text(capsys.readouterr().out)
    spec = load_spec(tmp_path / "timm.yaml")
    assert [op.name for op in spec.ops] == ["random_resized_crop", "horizontal_flip", "rand_augment", "normalize",
                                            "random_erasing", "batch_mix"]
    assert cli.main(["from-timm", "--source", str(tmp_path), "--", "--aa", "v0-x1"]) == 2
    err = capsys.readouterr().err
    assert "--aa v0-x1: unknown AutoAugment section 'x1'" in err


def test_the_cli_takes_timms_arguments_without_the_dashes_as_with_them(tmp_path, capsys):
    timm_line = ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "-b", "64", "--mixup", "0.8"]
    assert cli.main(["from-timm", "--source", str(tmp_path), "--", *timm_line]) == 0
    with_dashes = capsys.readouterr().out
    # timm's arguments first, this command's own among and after them, one in its --name=value form
    assert cli.main(["from-timm", *timm_line[:4], "--source", str(tmp_path), *timm_line[4:], "--name=from-timm"]) == 0
    assert capsys.readouterr().out == with_dashes
    assert cli.main(["from-timm", "--source", str(tmp_path), "--aa", "v0-x1"]) == 2
    assert "--aa v0-x1: unknown AutoAugment section 'x1'" in capsys.readouterr().err
    assert cli.main(["from-timm", "--source", str(tmp_path), "--model", "resnet50"]) == 2
    assert "--model: not one of timm's data arguments from_timm reads" in capsys.readouterr().err


def test_only_from_timm_moves_arguments_behind_the_dashes():
    from dali_bridge.cli.recipes import timm_arguments_apart

    assert timm_arguments_apart(["-v", "from-timm", "--aa", "x", "--set", "seed=1", "--source"]) == \
        ["-v", "from-timm", "--set", "seed=1", "--source", "--", "--aa", "x"]
    for line in (["validate", "p.yaml", "--aa"], ["from-timm", "--source", "d", "--", "--aa", "x"], ["-v"]):
        assert timm_arguments_apart(line) == line


def test_a_mappings_values_are_typed_as_train_py_types_them():
    assert dict(ops_of(convert({"hflip": "0.25", "scale": [0.3, 1]})))["horizontal_flip"] == {"probability": 0.25}
    with pytest.raises(RecipeError) as error:
        convert({"hflip": "often", "input-size": [3, "x", 2]})
    assert error.value.problems == ["hflip: expected float, found 'often'",
                                    "input-size: expected int values, found [3, 'x', 2]"]
    with pytest.raises(RecipeError, match="argument --input-size: expected 3 arguments"):
        convert("--input-size 3 224")


@pytest.mark.parametrize("config", ["original-mstd0.5", "v0r", "3a", "augmix-m5-w4-d2", "augmix-m3-mstd0.5-b1"])
def test_the_cli_prints_timms_policies_as_a_pipeline_file_that_loads_back_the_same(tmp_path, capsys, config):
    assert cli.main(["from-timm", "--source", str(tmp_path), "--crop-interpolation", "bicubic", "--",
                     "--aa", config]) == 0
    (tmp_path / "timm.yaml").write_text(capsys.readouterr().out)
    loaded = load_spec(tmp_path / "timm.yaml")
    assert ops_of(loaded) == ops_of(convert(["--aa", config], crop_interpolation="bicubic"))
    assert loaded.ops[2].name == ("timm_augmix" if config.startswith("augmix") else "timm_auto_augment")


@pytest.mark.slow  # whole epochs on both CPU backends
@pytest.mark.parametrize("line", [
    "", "--aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --smoothing 0.1",
    "--aa rand-m7-mstd0.5-inc1 --train-interpolation bicubic", "--aa augmix-m3-w3 --hflip 0"])
def test_timms_lines_give_the_same_batches_on_dali_cpu_and_torchvision(sample_root, line):
    from dali_bridge.loader.select import available_backends
    from dali_bridge.tools.compare import compare

    if not {"dali-cpu", "torchvision"} <= set(available_backends()):
        pytest.skip(f"needs dali-cpu and torchvision; this host has {available_backends()}")
    spec = from_timm(line, source=sample_root, batch_size=8, overrides={"loader.workers": 1})
    result = compare(spec, ("dali-cpu", "torchvision"), batches=None)
    assert result.passed and result.samples == 37, result.format()
    assert result.output("image").max_abs <= 1.0, result.format()
