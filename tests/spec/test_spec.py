"""Pipeline files → validated PipelineSpec: every problem at once, with file:line:col, key path,
expected and found; overrides; relative paths; round trip; safety; shorthands."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from dali_bridge.spec.model import OpSpec
from dali_bridge.spec.overrides import parse_override
from dali_bridge.spec.pipeline import PipelineSpec, load_spec, spec_from_dict
from dali_bridge.spec.problems import Problem, SpecError

SHIPPED = sorted((REPO / "pipelines").glob("*.yaml"))

# A small valid pipeline; tests replace parts of it.
HEAD = """\
version: 1
source:
  type: folder
  root: images
batch_size: 8
"""
TRAIN_OPS = """\
ops:
  - random_resized_crop: 224
  - horizontal_flip
  - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
"""


def write(tmp_path: Path, text: str, name: str = "pipe.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def errors(path_or_data, overrides=None) -> list[Problem]:
    """The problems a file (Path) or raw data (dict) is rejected with."""
    with pytest.raises(SpecError) as info:
        if isinstance(path_or_data, Path):
            load_spec(path_or_data, overrides)
        else:
            spec_from_dict(path_or_data, overrides=overrides)
    assert info.value.problems, "SpecError without problems"
    return info.value.problems


def by_path(problems: list[Problem]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in problems:
        out.setdefault(p.path, []).append(p.message)
    return out


def only_problem(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, "\n".join(map(str, problems))
    return problems[0]


def with_ops(ops_yaml: str) -> str:
    return HEAD + "ops:\n" + "".join(f"  - {line}\n" for line in ops_yaml)


def ops_data(*ops) -> dict:
    return {"version": 1, "source": {"type": "folder", "root": "/data"}, "batch_size": 8, "ops": list(ops)}


# --------------------------------------------------------------------------------------------
# Shipped pipelines and round trip

def test_shipped_pipelines_exist():
    assert {p.name for p in SHIPPED} == {"imagenet_train.yaml", "imagenet_val.yaml", "timm_train.yaml",
                                         "torchvision_recipe_train.yaml", "torchvision_recipe_val.yaml",
                                         "simclr_train.yaml", "byol_train.yaml", "dino_train.yaml"}


def test_the_torchvision_recipe_pipeline_is_the_whole_recipe():
    spec = load_spec(REPO / "pipelines" / "torchvision_recipe_train.yaml")
    ops = {op.name: op.params for op in spec.ops}
    assert list(ops) == ["random_resized_crop", "horizontal_flip", "trivial_augment_wide", "normalize",
                         "random_erasing", "batch_mix"]
    assert ops["random_resized_crop"]["size"] == 176 and ops["random_erasing"]["probability"] == 0.1
    assert (ops["batch_mix"]["mixup_alpha"], ops["batch_mix"]["cutmix_alpha"]) == (0.2, 1.0)
    assert spec.label_smoothing == 0.1 and spec.loader.repeated_augmentations == 4
    assert spec.outputs == ("image", "target")
    val = load_spec(REPO / "pipelines" / "torchvision_recipe_val.yaml")
    assert [(op.name, op.params["size"]) for op in val.ops[:2]] == [("resize", 232), ("center_crop", 224)]


def test_shipped_train_pipeline_loads_with_values_from_the_file():
    spec = load_spec(REPO / "pipelines" / "imagenet_train.yaml")
    assert spec.name == "imagenet-train"
    assert spec.batch_size == 64 and spec.backend == "auto" and spec.decode_device == "mixed"
    assert [op.name for op in spec.ops] == ["random_resized_crop", "horizontal_flip", "normalize"]
    assert spec.ops[0].params == {"size": 224, "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3],
                                  "interpolation": "bilinear", "antialias": True}
    assert spec.loader.workers is None and spec.loader.shuffle is True
    assert spec.source.root == str((REPO / "data" / "sample").resolve())


def test_shipped_val_pipeline_loads_with_values_from_the_file():
    spec = load_spec(REPO / "pipelines" / "imagenet_val.yaml")
    assert [op.name for op in spec.ops] == ["resize", "center_crop", "normalize"]
    assert spec.ops[0].params == {"size": 256, "max_size": None, "interpolation": "bilinear", "antialias": True}
    assert spec.ops[1].params == {"size": 224}
    assert spec.loader.shuffle is False


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_round_trip_through_yaml_safe_load_gives_an_equal_spec(path):
    spec = load_spec(path)
    again = spec_from_dict(yaml.safe_load(spec.to_yaml()))
    assert again == spec
    assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_round_trip_through_a_dumped_file_in_another_folder_gives_an_equal_spec(path, tmp_path, monkeypatch):
    spec = load_spec(path)
    dumped = write(tmp_path, spec.to_yaml(), "elsewhere/dumped.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_spec(dumped) == spec


def test_dump_fills_every_default(tmp_path):
    spec = load_spec(write(tmp_path, HEAD + TRAIN_OPS))
    dumped = yaml.safe_load(spec.to_yaml())
    assert dumped == {
        "version": 1,
        "name": "pipe",  # the file's stem
        "backend": "auto",
        "source": {"type": "folder", "root": str((tmp_path / "images").resolve()),
                   "extensions": [".jpg", ".jpeg", ".png", ".webp"]},
        "batch_size": 8,
        "seed": 0,
        "decode": {"device": "mixed"},
        "parity": "exact",
        "ops": [
            {"random_resized_crop": {"size": 224, "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3],
                                     "interpolation": "bilinear", "antialias": True}},
            {"horizontal_flip": {"probability": 0.5}},
            {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                           "dtype": "float32", "layout": "CHW"}},
        ],
        "outputs": ["image", "label"],
        "loader": {"workers": None, "prefetch": 2, "last_batch": "partial", "on_error": "raise",
                   "shuffle": True, "repeated_augmentations": 1},
    }
    assert spec_from_dict(dumped) == spec


def test_validation_does_not_import_torch_or_dali():
    code = ("import sys; from dali_bridge.spec.pipeline import load_spec; "
            f"load_spec({str(SHIPPED[0])!r}); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'nvidia')]; "
            "assert not bad, bad")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------------------------
# Unknown keys and ops, with did-you-mean

def test_unknown_top_level_key_suggests_the_closest_key(tmp_path):
    problems = by_path(errors(write(tmp_path, HEAD.replace("batch_size", "bach_size") + TRAIN_OPS)))
    (message,) = problems["bach_size"]
    assert "unknown key 'bach_size' in the pipeline" in message
    assert "did you mean 'batch_size'?" in message
    assert "missing required key 'batch_size'" in problems["batch_size"][0]


def test_unknown_loader_key_suggests_prefetch(tmp_path):
    text = HEAD + TRAIN_OPS + "loader:\n  prefetsh: 4\n"
    problem = only_problem(errors(write(tmp_path, text)))
    assert problem.path == "loader.prefetsh"
    assert "unknown key 'prefetsh' in loader" in problem.message
    assert "did you mean 'prefetch'?" in problem.message


def test_unknown_op_parameter_suggests_the_closest_parameter(tmp_path):
    text = with_ops(["random_resized_crop: {size: 224, scal: [0.5, 1.0]}", "normalize"])
    problem = only_problem(errors(write(tmp_path, text)))
    assert problem.path == "ops[0].random_resized_crop.scal"
    assert "unknown key 'scal' in op 'random_resized_crop'" in problem.message
    assert "did you mean 'scale'?" in problem.message


def test_unknown_source_and_decode_keys_are_reported(tmp_path):
    text = HEAD.replace("  root: images", "  rot: images") + "decode: {devise: cpu}\n" + TRAIN_OPS
    problems = by_path(errors(write(tmp_path, text)))
    assert "did you mean 'root'?" in problems["source.rot"][0]
    assert "missing required key 'source.root'" in problems["source"][0]
    assert "did you mean 'device'?" in problems["decode.devise"][0]


def test_unknown_key_without_a_close_match_has_no_suggestion(tmp_path):
    problem = only_problem(errors(write(tmp_path, HEAD + TRAIN_OPS + "zzzzqq: 1\n")))
    assert problem.path == "zzzzqq"
    assert "unknown key 'zzzzqq'" in problem.message and "did you mean" not in problem.message


@pytest.mark.parametrize("op, points_to", [("augmix", "timm_augmix"), ("auto_augment", "timm_auto_augment")])
def test_a_timm_variant_key_on_torchvisions_policy_points_to_the_timm_op(tmp_path, op, points_to):
    text = with_ops(["random_resized_crop: {size: 224}", f"{op}: {{variant: timm}}", "normalize"])
    problem = only_problem(errors(write(tmp_path, text)))
    assert problem.path == f"ops[1].{op}.variant"
    assert f"unknown key 'variant' in op '{op}'" in problem.message and f"the op {points_to}" in problem.message


def test_no_op_hints_at_a_key_it_has():
    from dali_bridge.ops.facets import SpecRules, facet
    from dali_bridge.ops.registry import OPS
    for name, op in OPS.items():
        assert not set(facet(op, SpecRules).key_hints) & {p.name for p in op.params}, name


def test_unknown_op_name_suggests_the_closest_op(tmp_path):
    text = with_ops(["random_resized_crp: {size: 224}", "normalize"])
    problem = only_problem(errors(write(tmp_path, text)))
    assert problem.path == "ops[0].random_resized_crp"
    assert "unknown op 'random_resized_crp'" in problem.message
    assert "did you mean 'random_resized_crop'?" in problem.message
    assert "center_crop" in problem.message  # lists the known ops


def test_unknown_bare_op_name_is_reported_at_its_list_item(tmp_path):
    text = with_ops(["center_crop: 224", "horizontal_flp", "normalize"])
    problem = only_problem(errors(write(tmp_path, text)))
    assert problem.path == "ops[1]"
    assert "unknown op 'horizontal_flp'" in problem.message and "did you mean 'horizontal_flip'?" in problem.message


# --------------------------------------------------------------------------------------------
# Wrong types

def test_batch_size_given_as_a_string_is_a_type_error(tmp_path):
    problem = only_problem(errors(write(tmp_path, HEAD.replace("batch_size: 8", 'batch_size: "64"') + TRAIN_OPS)))
    assert problem.path == "batch_size"
    assert problem.message == "expected an integer >= 1, found a string '64'"


def test_batch_size_given_as_a_boolean_is_a_type_error():
    data = ops_data({"center_crop": 224})
    data["batch_size"] = True
    problem = only_problem(errors(data))
    assert problem.path == "batch_size" and "found a boolean True" in problem.message


@pytest.mark.parametrize("op", ["resize", "random_resized_crop", "center_crop"])
def test_size_given_as_a_word_is_a_type_error_and_does_not_crash_cross_op_checks(tmp_path, op):
    ops = [f"{op}: {{size: big}}"] + (["center_crop: 224"] if op == "resize" else []) + ["normalize"]
    problem = only_problem(errors(write(tmp_path, with_ops(ops))))
    assert problem.path == f"ops[0].{op}.size"
    assert problem.message == "expected a size in pixels (an integer or [height, width]), found a string 'big'"


@pytest.mark.parametrize("mean, found", [('"imagenet"', "found a string 'imagenet'"),
                                         ("{r: 0.5}", "found a mapping {'r': 0.5}")])
def test_mean_that_is_not_a_list_is_a_type_error(tmp_path, mean, found):
    problem = only_problem(errors(write(tmp_path, with_ops(["center_crop: 224", f"normalize: {{mean: {mean}}}"]))))
    assert problem.path == "ops[1].normalize.mean"
    assert problem.message.startswith("expected mean as 3 numbers (R, G, B) in [0, 1] units")
    assert found in problem.message


def test_a_single_number_for_mean_and_std_applies_to_all_three_channels():
    spec = spec_from_dict(ops_data({"center_crop": 224}, {"normalize": {"mean": 0.5, "std": 0.25}}))
    assert spec.ops[1]["mean"] == [0.5, 0.5, 0.5] and spec.ops[1]["std"] == [0.25, 0.25, 0.25]


@pytest.mark.parametrize("key, value, path, snippet", [
    ("ops", {"center_crop": 224}, "ops", "expected a list of ops, found a mapping"),
    ("source", "images/", "source", "expected the source as a mapping, found a string 'images/'"),
    ("loader", [1], "loader", "expected the loader settings as a mapping, found a list"),
    ("outputs", "image", "outputs", "expected a non-empty list drawn from image, label, index, valid"),
    ("seed", 1.5, "seed", "expected an integer >= 0, found a number 1.5"),
    ("name", 7, "name", "expected a non-empty string, found an integer 7"),
])
def test_wrong_types_of_top_level_values_are_reported(key, value, path, snippet):
    data = ops_data({"center_crop": 224})
    data[key] = value
    assert snippet in by_path(errors(data))[path][0]


@pytest.mark.parametrize("loader, path, snippet", [
    ({"shuffle": "maybe"}, "loader.shuffle", "expected true or false, found a string 'maybe'"),
    ({"workers": "many"}, "loader.workers", "expected an integer >= 0 or null, found a string 'many'"),
    ({"last_batch": "keep"}, "loader.last_batch", "expected one of partial, drop, pad, found 'keep'"),
    ({"on_error": "ignore"}, "loader.on_error", "expected one of raise, skip, found 'ignore'"),
])
def test_wrong_loader_values_are_reported(loader, path, snippet):
    data = ops_data({"center_crop": 224}, )
    data["loader"] = loader
    problem = only_problem(errors(data))
    assert problem.path == path and snippet in problem.message


def test_loader_workers_auto_means_none_and_an_integer_is_kept():
    data = ops_data({"center_crop": 224})
    data["loader"] = {"workers": "auto"}
    assert spec_from_dict(data).loader.workers is None
    data["loader"] = {"workers": 3}
    assert spec_from_dict(data).loader.workers == 3


@pytest.mark.parametrize("key, value, path, snippet", [
    ("backend", "cuda", "backend", "expected one of auto, dali, dali-cpu, torchvision, found 'cuda'"),
    ("decode", {"device": "gpu"}, "decode.device", "expected one of mixed, cpu, found 'gpu'"),
    ("source", {"type": "webdataset"}, "source", "missing required key 'source.shards'"),
    ("source", {"type": "foldr", "root": "/x"}, "source.type", "did you mean 'folder'?"),
    ("source", {"type": "folder"}, "source", "missing required key 'source.root'"),
    ("source", {"root": "/x"}, "source", "missing required key 'source.type'"),
    ("source", {"type": "file_list", "root": "/x"}, "source", "missing required key 'source.file_list'"),
    ("source", {"type": "folder", "root": "/x", "extensions": []}, "source.extensions",
     "expected a non-empty list of file extensions"),
    ("source", {"type": "folder", "root": ""}, "source.root", "expected a path (string), found a string ''"),
    ("outputs", ["image", "lable"], "outputs[1]", "unknown output 'lable'"),
    ("outputs", ["image", "image"], "outputs", "each output may appear once; repeated: image"),
])
def test_invalid_choices_and_source_settings_are_reported(key, value, path, snippet):
    data = ops_data({"center_crop": 224})
    data[key] = value
    problem = only_problem(errors(data))
    assert problem.path == path and snippet in problem.message


def test_unknown_output_suggests_the_closest_output():
    data = ops_data({"center_crop": 224})
    data["outputs"] = ["image", "lable"]
    assert "did you mean 'label'?" in only_problem(errors(data)).message


def test_source_extensions_are_normalised_to_lowercase_with_a_dot():
    data = ops_data({"center_crop": 224})
    data["source"]["extensions"] = ["JPG", ".Png"]
    assert spec_from_dict(data).source.extensions == (".jpg", ".png")


# --------------------------------------------------------------------------------------------
# Out-of-range values

@pytest.mark.parametrize("op, path, message", [
    ("random_resized_crop: {size: 224, scale: [0.0, 1.0]}", "ops[0].random_resized_crop.scale",
     "expected both ends in (0.0, 1.0], found [0.0, 1.0]"),
    ("random_resized_crop: {size: 224, scale: [0.5, 1.5]}", "ops[0].random_resized_crop.scale",
     "expected both ends in (0.0, 1.0], found [0.5, 1.5]"),
    ("random_resized_crop: {size: 224, scale: [0.9, 0.1]}", "ops[0].random_resized_crop.scale",
     "expected low <= high, found [0.9, 0.1]"),
    ("random_resized_crop: {size: 224, ratio: [0, 2]}", "ops[0].random_resized_crop.ratio",
     "expected both ends in (0.0, inf), found [0, 2]"),
    ("random_resized_crop: {size: 224, scale: 0.5}", "ops[0].random_resized_crop.scale",
     "expected [low, high] fractions of the image area, found a number 0.5"),
    ("resize: -5", "ops[0].resize.size", "expected a positive size in pixels, found -5"),
    ("center_crop: [224, 0]", "ops[0].center_crop.size", "expected positive sizes in pixels, found [224, 0]"),
    ("resize: 100000000000000000000", "ops[0].resize.size",
     "expected a size of at most 16384 pixels, found 10000000...(21 digits)"),
    ("center_crop: [224, 20000]", "ops[0].center_crop.size",
     "expected sizes of at most 16384 pixels, found [224, 20000]"),
    ("center_crop: [224, 224, 3]", "ops[0].center_crop.size",
     "expected a size in pixels (an integer or [height, width]), found a list [224, 224, 3]"),
    ("normalize: {std: 0}", "ops[0].normalize.std", "expected every std value > 0, found [0, 0, 0]"),
    ("normalize: {std: [0.2, 0.0, 0.2]}", "ops[0].normalize.std",
     "expected every std value > 0, found [0.2, 0.0, 0.2]"),
    ("normalize: {mean: [0.5, 0.5]}", "ops[0].normalize.mean",
     "expected 3 values (R, G, B) for mean, found 2: [0.5, 0.5]"),
    ("normalize: {std: [0.1, 0.2, 0.3, 0.4]}", "ops[0].normalize.std",
     "expected 3 values (R, G, B) for std, found 4: [0.1, 0.2, 0.3, 0.4]"),
    ("normalize: {mean: [123.7, 116.3, 103.5]}", "ops[0].normalize.mean",
     "expected mean in [0, 1] units like torchvision's (e.g. 0.229, not 58.4), found [123.7, 116.3, 103.5]"),
    ("horizontal_flip: 1.5", "ops[0].horizontal_flip.probability", "expected a probability in [0, 1], found 1.5"),
    ("horizontal_flip: {probability: -0.1}", "ops[0].horizontal_flip.probability",
     "expected a probability in [0, 1], found -0.1"),
    ("horizontal_flip: {probability: yes please}", "ops[0].horizontal_flip.probability",
     "expected a probability (number in [0, 1]), found a string 'yes please'"),
    ("resize: {size: 256, max_size: 0}", "ops[0].resize.max_size", "expected a positive size in pixels, found 0"),
    ("resize: {size: 256, interpolation: lanczos}", "ops[0].resize.interpolation",
     "expected one of nearest, bilinear, bicubic, found 'lanczos'"),
    ("normalize: {layout: NCHW}", "ops[0].normalize.layout", "expected one of CHW, HWC, found 'NCHW'"),
])
def test_out_of_range_op_parameters_are_reported_with_their_key_path(op, path, message):
    data = ops_data(yaml.safe_load(f"- {op}")[0], {"center_crop": 100})
    problems = by_path(errors(data))
    assert message in problems[path], problems


@pytest.mark.parametrize("key, value, path, message", [
    ("batch_size", 0, "batch_size", "expected an integer >= 1, found 0"),
    ("batch_size", -8, "batch_size", "expected an integer >= 1, found -8"),
    ("seed", -1, "seed", "expected an integer >= 0, found -1"),
    ("loader", {"prefetch": 0}, "loader.prefetch", "expected an integer >= 1, found 0"),
    ("loader", {"workers": -2}, "loader.workers", "expected an integer >= 0, found -2"),
    ("version", 2, "version", "expected format version 1, found 2"),
    ("version", True, "version", "expected format version 1, found True"),
])
def test_out_of_range_top_level_values_are_reported(key, value, path, message):
    data = ops_data({"center_crop": 224})
    data[key] = value
    problem = only_problem(errors(data))
    assert (problem.path, problem.message) == (path, message)


# --------------------------------------------------------------------------------------------
# Contradictions between ops

def test_center_crop_larger_than_the_preceding_resize_is_rejected():
    problem = only_problem(errors(ops_data({"resize": 256}, {"center_crop": 300}, "normalize")))
    assert problem.path == "ops[1].center_crop.size"
    assert problem.message == ("crop [300, 300] is larger than the preceding resize's shorter side (256 px): "
                               "images would be padded with zeros")


def test_non_square_crop_with_one_side_beyond_the_resize_is_rejected():
    problem = only_problem(errors(ops_data({"resize": 256}, {"center_crop": [224, 300]})))
    assert problem.path == "ops[1].center_crop.size"
    assert problem.message.startswith("crop [224, 300] is larger than the preceding resize's shorter side (256 px)")


def test_center_crop_larger_than_a_fixed_output_size_is_rejected():
    problem = only_problem(errors(ops_data({"resize": [224, 224]}, {"center_crop": [240, 200]})))
    assert problem.path == "ops[1].center_crop.size"
    assert "crop [240, 200] is larger than the preceding output size [224, 224] (height, width)" in problem.message


def test_center_crop_equal_to_the_resize_is_accepted():
    spec = spec_from_dict(ops_data({"resize": 224}, {"center_crop": 224}))
    assert spec.ops[1]["size"] == 224


def test_crop_mirror_normalize_crop_larger_than_a_random_resized_crop_is_rejected():
    problem = only_problem(errors(ops_data({"random_resized_crop": 160}, {"crop_mirror_normalize": {"crop": 224}})))
    assert problem.path == "ops[1].crop_mirror_normalize.crop"
    assert "crop [224, 224] is larger than the preceding output size [160, 160]" in problem.message


def test_normalize_followed_by_a_uint8_op_is_rejected():
    problem = only_problem(errors(ops_data({"random_resized_crop": 224}, "normalize", "horizontal_flip")))
    assert problem.path == "ops[1]"
    assert problem.message == ("'normalize' must come after every op on uint8 images (it converts dtype and layout); "
                               "ops[2] 'horizontal_flip' follows it")


def test_two_normalizes_are_rejected():
    problems = by_path(errors(ops_data({"random_resized_crop": 224}, "normalize", "normalize")))
    assert problems == {"ops[2]": ["only one normalize/crop_mirror_normalize op is allowed"]}


def test_normalize_and_crop_mirror_normalize_together_are_rejected():
    problems = by_path(errors(ops_data({"resize": 256}, "normalize", {"crop_mirror_normalize": {"crop": 224}})))
    assert problems["ops[2]"] == ["only one normalize/crop_mirror_normalize op is allowed"]


@pytest.mark.parametrize("ops", [
    [{"resize": 256}],
    [{"resize": 256}, "normalize"],
    [{"random_resized_crop": 224}, {"resize": 256}],
    ["horizontal_flip", "normalize"],
    [{"resize": 256}, {"crop_mirror_normalize": {"mirror": 0.5}}],
], ids=["resize-int-only", "resize-int-then-normalize", "resize-int-after-crop", "no-geometry", "cmn-without-crop"])
def test_output_size_that_is_not_fixed_is_rejected(ops):
    problem = only_problem(errors(ops_data(*ops)))
    assert problem.path == "ops"
    assert problem.message.startswith("the pipeline's output size is not fixed, so images cannot be batched")


@pytest.mark.parametrize("ops", [
    [{"resize": [256, 320]}],
    [{"resize": 256}, {"crop_mirror_normalize": {"crop": [224, 200]}}],
    [{"random_resized_crop": [160, 192]}, "horizontal_flip"],
])
def test_fixed_output_sizes_are_accepted(ops):
    assert len(spec_from_dict(ops_data(*ops)).ops) == len(ops)


def test_empty_op_list_is_rejected():
    problem = only_problem(errors(ops_data()))
    assert problem.path == "ops" and "expected at least one op" in problem.message


def test_cross_op_rules_still_report_alongside_parameter_errors():
    problems = by_path(errors(ops_data({"resize": -3}, "normalize", "normalize")))
    assert set(problems) == {"ops[0].resize.size", "ops[2]"}


# --------------------------------------------------------------------------------------------
# Missing required keys; invalid YAML

@pytest.mark.parametrize("key, path, message", [
    ("version", "<top level>", "missing required key 'version' (expected 1)"),
    ("source", "<top level>", "missing required key 'source'"),
    ("batch_size", "batch_size", "missing required key 'batch_size' (expected an integer >= 1)"),
    ("ops", "ops", "missing required key 'ops'"),
])
def test_missing_required_key_is_reported(key, path, message):
    data = ops_data({"center_crop": 224})
    del data[key]
    problem = only_problem(errors(data))
    assert problem.path == path and problem.message.startswith(message)


def test_missing_source_root_is_reported_at_the_source_key(tmp_path):
    text = "version: 1\nbatch_size: 8\nsource:\n  type: folder\nops: [center_crop: 224]\n"
    path = write(tmp_path, text)
    problem = only_problem(errors(path))
    assert problem.path == "source"
    assert problem.where == f"{path}:3:1"
    assert problem.message.startswith("missing required key 'source.root'")


def test_empty_file_reports_every_missing_required_key_at_once(tmp_path):
    messages = [p.message for p in errors(write(tmp_path, "# nothing here\n"))]
    for key in ("version", "source", "batch_size", "ops"):
        assert any(m.startswith(f"missing required key '{key}'") for m in messages), messages


def test_top_level_that_is_not_a_mapping_is_rejected(tmp_path):
    problem = only_problem(errors(write(tmp_path, "- resize: 256\n")))
    assert "expected a mapping of keys, found a list" in problem.message


def test_invalid_yaml_syntax_is_reported_with_its_line_and_column(tmp_path):
    path = write(tmp_path, "version: 1\nsource:\n  type: folder\n  root: imgs\nbatch_size: 8: 9\n")
    problem = only_problem(errors(path))
    assert problem.where == f"{path}:5:14"
    assert problem.path == "<yaml>"
    assert problem.message == "not valid YAML: mapping values are not allowed here"


def test_unclosed_flow_list_is_reported_as_invalid_yaml(tmp_path):
    path = write(tmp_path, HEAD + "ops: [center_crop: 224\n")
    problem = only_problem(errors(path))
    assert problem.path == "<yaml>" and problem.message.startswith("not valid YAML")
    assert problem.where.startswith(f"{path}:")


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------------------------
# uint8 output

@pytest.mark.parametrize("op", ["normalize", "crop_mirror_normalize"])
def test_uint8_dtype_with_non_identity_mean_or_std_is_rejected(op):
    problem = only_problem(errors(ops_data({"center_crop": 224}, {op: {"dtype": "uint8", "std": [0.5, 0.5, 0.5]}})))
    assert problem.path == f"ops[1].{op}.dtype"
    assert problem.message.startswith("uint8 output cannot hold normalised values")


def test_uint8_dtype_with_identity_mean_and_std_is_accepted():
    spec = spec_from_dict(ops_data({"center_crop": 224},
                                   {"normalize": {"dtype": "uint8", "mean": [0, 0, 0], "std": 1}}))
    assert spec.ops[1].params == {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "dtype": "uint8", "layout": "CHW"}


# --------------------------------------------------------------------------------------------
# Line and column

LINED = """\
version: 1
source: {type: folder, root: imgs}
batch_size: 8
ops:
  - random_resized_crop:
      size: 224
      scale: [0.0, 1.0]
  - random_resized_crp: 224
  - horizontal_flp
loader:
    prefetsh: 3
bach_size: 8
"""


def test_reported_where_is_file_line_column_of_the_offending_key(tmp_path):
    path = write(tmp_path, LINED)
    where = {p.path: p.where for p in errors(path)}
    assert where == {
        "ops[0].random_resized_crop.scale": f"{path}:7:7",
        "ops[1].random_resized_crp": f"{path}:8:5",
        "ops[2]": f"{path}:9:5",
        "loader.prefetsh": f"{path}:11:5",
        "bach_size": f"{path}:12:1",
    }


def test_error_text_lists_each_problem_as_where_path_message(tmp_path):
    path = write(tmp_path, LINED)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 5 problems:")
    assert (f"  {path}:7:7: ops[0].random_resized_crop.scale: expected both ends in (0.0, 1.0], "
            "found [0.0, 1.0]") in text.splitlines()


def test_problem_in_a_scalar_shorthand_is_reported_at_the_op_key(tmp_path):
    path = write(tmp_path, HEAD + "ops:\n  - center_crop: 224\n\n  - horizontal_flip: 1.5\n")
    problem = only_problem(errors(path))
    assert problem.path == "ops[1].horizontal_flip.probability"
    assert problem.where == f"{path}:9:5"


def test_problems_in_data_without_a_file_are_reported_at_the_origin():
    with pytest.raises(SpecError) as info:
        spec_from_dict(dict(ops_data({"center_crop": 224}), batch_size="8"), origin="my-config")
    assert only_problem(info.value.problems).where == "my-config"


# --------------------------------------------------------------------------------------------
# Many problems at once

def test_every_problem_in_a_file_is_reported_in_one_error(tmp_path):
    text = """\
version: 1
source:
  type: folder
batch_size: "64"
ops:
  - random_resized_crop: {size: 224, scale: [0.5, 1.5]}
  - normalize: {mean: [0.5, 0.5], std: 0}
  - horizontal_flip: 1.5
outputs: [image, lable]
loader:
  prefetsh: 2
"""
    problems = errors(write(tmp_path, text))
    assert sorted(p.path for p in problems) == sorted([
        "source",                               # missing root
        "batch_size",                           # wrong type
        "ops[0].random_resized_crop.scale",     # out of range
        "ops[1].normalize.mean",                # wrong length
        "ops[1].normalize.std",                 # std 0
        "ops[1]",                               # normalize not last
        "ops[2].horizontal_flip.probability",   # 1.5
        "outputs[1]",                           # unknown output
        "loader.prefetsh",                      # unknown key
    ])
    assert len({p.where for p in problems}) >= 8  # each has its own position


# --------------------------------------------------------------------------------------------
# Relative paths

def test_relative_root_resolves_against_the_yaml_folder_not_the_cwd(tmp_path, monkeypatch):
    path = write(tmp_path, HEAD.replace("root: images", "root: ../data/images") + TRAIN_OPS, "configs/p.yaml")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_spec(path).source.root == str((tmp_path / "data" / "images").resolve())
    assert load_spec(os.path.relpath(path)).source.root == str((tmp_path / "data" / "images").resolve())


def test_relative_file_list_resolves_against_the_yaml_folder(tmp_path, monkeypatch):
    text = HEAD.replace("  type: folder\n  root: images", "  type: file_list\n  file_list: lists/train.txt") + TRAIN_OPS
    path = write(tmp_path, text, "configs/p.yaml")
    monkeypatch.chdir(tmp_path)
    spec = load_spec(path)
    assert spec.source.type == "file_list" and spec.source.root is None
    assert spec.source.file_list == str((tmp_path / "configs" / "lists" / "train.txt").resolve())


def test_absolute_and_home_relative_roots_do_not_depend_on_the_yaml_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = write(tmp_path, HEAD.replace("root: images", "root: ~/imgs") + TRAIN_OPS, "configs/p.yaml")
    assert load_spec(path).source.root == str(tmp_path / "home" / "imgs")
    path = write(tmp_path, HEAD.replace("root: images", "root: /srv/imgs") + TRAIN_OPS, "configs/p.yaml")
    assert load_spec(path).source.root == "/srv/imgs"


def test_relative_path_in_an_override_resolves_against_the_cwd(tmp_path, monkeypatch):
    path = write(tmp_path, HEAD + TRAIN_OPS, "configs/p.yaml")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    cwd_data = str((tmp_path / "cwd" / "data" / "x").resolve())
    assert load_spec(path, ["source.root=data/x"]).source.root == cwd_data
    assert load_spec(path, {"source": {"type": "folder", "root": "data/x"}}).source.root == cwd_data


def test_relative_root_of_raw_data_resolves_against_base_dir(tmp_path):
    data = dict(ops_data({"center_crop": 224}), source={"type": "folder", "root": "imgs"})
    assert spec_from_dict(data, base_dir=tmp_path).source.root == str((tmp_path / "imgs").resolve())


# --------------------------------------------------------------------------------------------
# Overrides

def test_mapping_override_sets_a_top_level_value(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS)
    spec = load_spec(path, overrides={"batch_size": 32})
    assert spec.batch_size == 32
    assert spec == load_spec(path).replace(batch_size=32)


def test_list_overrides_are_parsed_as_yaml_values(tmp_path):
    spec = load_spec(write(tmp_path, HEAD + TRAIN_OPS),
                     ["batch_size=32", "source.root=/data/x", "loader.shuffle=false", "source.extensions=[.png]"])
    assert spec.batch_size == 32
    assert spec.source.root == "/data/x"
    assert spec.loader.shuffle is False
    assert spec.source.extensions == (".png",)


def test_override_with_a_list_index_path_changes_one_op_parameter(tmp_path):
    text = with_ops(["random_resized_crop: {size: 224, scale: [0.25, 1.0]}", "normalize"])
    path = write(tmp_path, text)
    spec = load_spec(path, ["ops.0.random_resized_crop.size=160"])
    assert spec.ops[0].params["size"] == 160
    assert spec.ops[0].params["scale"] == [0.25, 1.0]  # the rest of the op is kept
    assert load_spec(path, {"ops.0.random_resized_crop.size": 160}) == spec


def test_override_with_a_negative_list_index_reports_the_override_as_origin(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS)
    assert load_spec(path, ["ops.-1.normalize.dtype=float16"]).ops[2]["dtype"] == "float16"
    problem = only_problem(errors(path, ["ops.-1.normalize.std=0"]))
    assert problem.path == "ops[2].normalize.std"
    assert problem.where == "--set ops.-1.normalize.std=0"


def test_overriding_a_mapping_replaces_it_whole(tmp_path):
    text = HEAD.replace("  root: images\n", "  root: images\n  extensions: [.png]\n") + TRAIN_OPS
    path = write(tmp_path, text)
    assert load_spec(path).source.extensions == (".png",)
    spec = load_spec(path, ["source={type: folder, root: /d}"])
    assert spec.source.root == "/d"
    assert spec.source.extensions == (".jpg", ".jpeg", ".png", ".webp")  # the file's list is gone


def test_overriding_a_mapping_without_a_required_key_is_reported_at_the_override(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS)
    problem = only_problem(errors(path, {"source": {"type": "folder"}}))
    assert problem.path == "source"
    assert problem.where.startswith('overrides["source"]=')
    assert "missing required key 'source.root'" in problem.message


def test_invalid_value_inside_a_replaced_mapping_is_reported_at_the_override_not_the_file(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS)  # the file has source.root on line 4
    problem = only_problem(errors(path, {"source": {"type": "folder", "root": 5}}))
    assert problem.path == "source.root"
    assert problem.where.startswith('overrides["source"]=')
    assert str(path) not in problem.where


def test_invalid_override_value_is_reported_with_its_set_origin(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS)
    problem = only_problem(errors(path, ["batch_size=big"]))
    assert problem.path == "batch_size"
    assert problem.where == "--set batch_size='big'"
    assert problem.message == "expected an integer >= 1, found a string 'big'"


def test_override_of_a_key_present_in_the_file_is_reported_at_the_override(tmp_path):
    path = write(tmp_path, with_ops(["random_resized_crop: {size: 224, scale: [0.25, 1.0]}", "normalize"]))
    problem = only_problem(errors(path, ["ops.0.random_resized_crop.scale=[0.0, 2.0]"]))
    assert problem.path == "ops[0].random_resized_crop.scale"
    assert problem.where.startswith("--set ops.0.random_resized_crop.scale=")


def test_override_problems_and_file_problems_are_reported_together(tmp_path):
    path = write(tmp_path, HEAD + TRAIN_OPS + "loader: {prefetsh: 2}\n")
    problems = errors(path, ["batch_size=0"])
    assert {(p.path, p.where.split(":")[0] if not p.where.startswith("--set") else "--set") for p in problems} == {
        ("loader.prefetsh", str(path)), ("batch_size", "--set")}


def test_override_with_an_unknown_key_is_reported_with_did_you_mean(tmp_path):
    problem = only_problem(errors(write(tmp_path, HEAD + TRAIN_OPS), ["loader.prefetsh=3"]))
    assert problem.path == "loader.prefetsh" and problem.where.startswith("--set loader.prefetsh")
    assert "did you mean 'prefetch'?" in problem.message


def test_override_with_a_list_index_out_of_range_is_reported(tmp_path):
    problem = only_problem(errors(write(tmp_path, HEAD + TRAIN_OPS), ["ops.7.resize.size=1"]))
    assert problem.where == "--set ops.7.resize.size=1"
    assert problem.message == "cannot address '7' inside a list"


@pytest.mark.parametrize("text, message", [
    ("batchsize32", "expected KEY=VALUE, e.g. batch_size=32"),
    ("batch_size=[1", "value is not valid YAML"),
])
def test_malformed_override_text_is_reported_with_its_set_origin(text, message):
    with pytest.raises(SpecError) as info:
        parse_override(text)
    problem = only_problem(info.value.problems)
    assert problem.where == f"--set {text}" and message in problem.message


def test_parse_override_reads_the_value_as_yaml():
    assert parse_override(" batch_size = 32") == ("batch_size", 32)
    assert parse_override("source.root=/a=b") == ("source.root", "/a=b")
    assert parse_override("loader.workers=") == ("loader.workers", None)


def test_replace_returns_a_new_validated_spec_and_keeps_the_original(tmp_path):
    spec = load_spec(write(tmp_path, HEAD + TRAIN_OPS))
    smaller = spec.replace(**{"batch_size": 16, "ops.0.random_resized_crop.size": 128})
    assert (smaller.batch_size, smaller.ops[0]["size"]) == (16, 128)
    assert (spec.batch_size, spec.ops[0]["size"]) == (8, 224)
    with pytest.raises(SpecError):
        spec.replace(batch_size=0)


# --------------------------------------------------------------------------------------------
# Safety

@pytest.mark.parametrize("tagged", [
    '!!python/object/apply:os.system ["touch {marker}"]',
    '!!python/object/apply:subprocess.call [["touch", "{marker}"]]',
    '!!python/name:os.system',
])
def test_python_tags_in_a_file_are_rejected_and_nothing_executes(tmp_path, tagged):
    marker = tmp_path / "hacked"
    path = write(tmp_path, HEAD + "name: " + tagged.format(marker=marker) + "\n" + TRAIN_OPS)
    problem = only_problem(errors(path))
    assert problem.path == "<yaml>"
    assert problem.where == f"{path}:6:7"
    assert "could not determine a constructor for the tag 'tag:yaml.org,2002:python/" in problem.message
    assert not marker.exists()


def test_python_tag_in_an_override_is_rejected_and_nothing_executes(tmp_path):
    marker = tmp_path / "hacked"
    path = write(tmp_path, HEAD + TRAIN_OPS)
    with pytest.raises(SpecError) as info:
        load_spec(path, [f'name=!!python/object/apply:os.system ["touch {marker}"]'])
    assert "value is not valid YAML" in only_problem(info.value.problems).message
    assert not marker.exists()


# --------------------------------------------------------------------------------------------
# Shorthands

def test_scalar_and_bare_shorthands_fill_defaults(tmp_path):
    spec = load_spec(write(tmp_path, with_ops(["resize: 256", "center_crop: 224", "horizontal_flip", "normalize"])))
    assert spec.ops == (
        OpSpec("resize", {"size": 256, "max_size": None, "interpolation": "bilinear", "antialias": True}),
        OpSpec("center_crop", {"size": 224}),
        OpSpec("horizontal_flip", {"probability": 0.5}),
        OpSpec("normalize", {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "dtype": "float32", "layout": "CHW"}),
    )


def test_scalar_shorthand_sets_the_primary_parameter():
    spec = spec_from_dict(ops_data({"random_resized_crop": [160, 192]}, {"horizontal_flip": 0.25}))
    assert spec.ops[0]["size"] == [160, 192] and spec.ops[0]["scale"] == [0.08, 1.0]
    assert spec.ops[1].params == {"probability": 0.25}


def test_op_with_a_null_value_takes_all_defaults():
    spec = spec_from_dict(ops_data({"center_crop": 224}, {"horizontal_flip": None}))
    assert spec.ops[1].params == {"probability": 0.5}


def test_scalar_shorthand_for_an_op_without_a_primary_parameter_is_rejected():
    problem = only_problem(errors(ops_data({"center_crop": 224}, {"normalize": 0.5})))
    assert problem.path == "ops[1].normalize"
    assert problem.message == "expected the parameters of 'normalize' as a mapping, found a number 0.5"


@pytest.mark.parametrize("op", ["resize", "center_crop", "random_resized_crop"])
def test_bare_op_with_a_required_parameter_reports_it_missing(op):
    problem = only_problem(errors(ops_data(op, {"center_crop": 64})))
    assert problem.path == f"ops[0].{op}"
    assert problem.message.startswith("missing required parameter 'size'")


@pytest.mark.parametrize("entry, found", [
    ({"resize": 256, "center_crop": 224}, "found a mapping"),
    ([1, 2], "found a list [1, 2]"),
    (None, "found null"),
])
def test_op_entry_that_is_not_one_name_is_rejected(entry, found):
    problem = only_problem(errors(ops_data({"center_crop": 224}, entry)))
    assert problem.path == "ops[1]"
    assert problem.message.startswith("expected an op as '- name: {params}' (one key per list item)")
    assert found in problem.message


# --------------------------------------------------------------------------------------------
# crop_mirror_normalize

def test_crop_mirror_normalize_parameters_are_validated_and_kept():
    params = {"crop": [224, 200], "mirror": 0.5, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
              "dtype": "float16", "layout": "HWC"}
    spec = spec_from_dict(ops_data({"resize": 256}, {"crop_mirror_normalize": params}))
    assert spec.ops[1] == OpSpec("crop_mirror_normalize", params)


def test_crop_mirror_normalize_defaults_are_filled():
    spec = spec_from_dict(ops_data({"center_crop": 224}, "crop_mirror_normalize"))
    assert spec.ops[1].params == {"crop": None, "mirror": 0.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
                                  "dtype": "float32", "layout": "CHW"}


@pytest.mark.parametrize("params, key, snippet", [
    ({"crop": "big"}, "crop", "expected a size in pixels (an integer or [height, width]), found a string 'big'"),
    ({"crop": -1}, "crop", "expected a positive size in pixels, found -1"),
    ({"mirror": 2}, "mirror", "expected a probability in [0, 1], found 2"),
    ({"mirror": True}, "mirror", "expected a probability (number in [0, 1]), found a boolean True"),
    ({"mean": [0.5, 0.5]}, "mean", "expected 3 values (R, G, B) for mean, found 2"),
    ({"std": 0}, "std", "expected every std value > 0"),
    ({"dtype": "int8"}, "dtype", "expected one of float32, float16, uint8, found 'int8'"),
    ({"layout": "NCHW"}, "layout", "expected one of CHW, HWC, found 'NCHW'"),
    ({"mirorr": 0.5}, "mirorr", "did you mean 'mirror'?"),
])
def test_crop_mirror_normalize_invalid_parameters_are_reported(params, key, snippet):
    problems = by_path(errors(ops_data({"resize": [256, 256]}, {"crop_mirror_normalize": params})))
    path = f"ops[1].crop_mirror_normalize.{key}"
    assert path in problems, problems
    assert any(snippet in m for m in problems[path]), problems[path]


def test_crop_mirror_normalize_must_follow_every_uint8_op():
    problem = only_problem(errors(ops_data({"crop_mirror_normalize": {"crop": 224}}, {"center_crop": 200})))
    assert problem.path == "ops[0]"
    assert problem.message == ("'crop_mirror_normalize' must come after every op on uint8 images (it converts dtype "
                               "and layout); ops[1] 'center_crop' follows it")


def test_specs_compare_equal_regardless_of_origin(tmp_path):
    a = load_spec(write(tmp_path, HEAD + TRAIN_OPS, "a/pipe.yaml"))
    b = spec_from_dict(yaml.safe_load(a.to_yaml()), origin="elsewhere")
    assert isinstance(b, PipelineSpec) and a == b and a.origin != b.origin


def test_override_of_one_parameter_keeps_an_ops_shorthand_value(tmp_path):
    text = with_ops(["resize: 256", "center_crop: 224", "horizontal_flip", "normalize"])
    spec = load_spec(write(tmp_path, text), {"ops.0.resize.interpolation": "bicubic",
                                            "ops.2.horizontal_flip.probability": 0.25})
    assert spec.ops[0].params["size"] == 256 and spec.ops[0].params["interpolation"] == "bicubic"
    assert spec.ops[2].params["probability"] == 0.25
