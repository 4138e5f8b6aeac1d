"""The ``views`` section: groups of views read with their per-view changes, every problem at the
key that holds it, ``--set`` reaching into a group, and what ``outputs`` must say with views."""
from __future__ import annotations

import textwrap

import pytest

from dali_bridge.spec.pipeline import load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError

MEAN_STD = "{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"
PIPELINE = textwrap.dedent(f"""\
    version: 1
    source: {{type: folder, root: images}}
    batch_size: 4
    views:
      global:
        count: 2
        ops:
          - random_resized_crop: {{size: 32, scale: [0.4, 1.0], interpolation: bicubic}}
          - horizontal_flip: {{probability: 0.5}}
          - gaussian_blur: {{kernel_size: 5, sigma: [0.1, 2.0]}}
          - normalize: {MEAN_STD}
        per_view:
          - {{}}
          - {{horizontal_flip: {{probability: 0.25}}}}
      local:
        count: 3
        ops:
          - random_resized_crop: {{size: 16, scale: [0.05, 0.4]}}
          - normalize: {MEAN_STD}
    outputs: [views, label]
    """)


def _write(tmp_path, text: str):
    path = tmp_path / "views.yaml"
    path.write_text(text)
    return path


def _problems(tmp_path, text: str, overrides=None) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(_write(tmp_path, text), overrides)
    return [str(problem) for problem in caught.value.problems]


def test_groups_are_read_in_order_with_each_views_changes_over_the_groups_ops(tmp_path):
    spec = load_spec(_write(tmp_path, PIPELINE))
    assert [(group.name, group.count) for group in spec.views] == [("global", 2), ("local", 3)]
    assert spec.ops == () and spec.outputs == ("views", "label")
    first, second = (spec.views[0].view_ops(v) for v in range(2))
    assert first[1].params == {"probability": 0.5} and second[1].params == {"probability": 0.25}
    assert first[0] == second[0]  # the crop is the group's, unchanged
    assert spec.views[1].view_ops(2)[0].params["scale"] == [0.05, 0.4]


def test_a_spec_with_views_round_trips_through_its_yaml(tmp_path):
    spec = load_spec(_write(tmp_path, PIPELINE))
    again = _write(tmp_path, spec.to_yaml())
    assert load_spec(again) == spec


def test_every_problem_of_a_group_is_placed_at_its_key(tmp_path):
    text = PIPELINE.replace("horizontal_flip: {probability: 0.5}", "horizontl_flip: {probability: 0.5}")
    text = text.replace("count: 3", "count: 0\n    colour: 3")
    problems = _problems(tmp_path, text)
    assert any(p.startswith(f"{tmp_path}/views.yaml:9:9: views.global.ops[1].horizontl_flip: unknown op")
               and "did you mean 'horizontal_flip'" in p for p in problems), problems
    assert any(":16:5: views.local.count: expected the group's number of views, an integer >= 1" in p
               for p in problems), problems
    assert any(":17:5: views.local.colour: unknown key 'colour' in views group 'local'" in p for p in problems)
    sigma = _problems(tmp_path, PIPELINE.replace("{horizontal_flip: {probability: 0.25}}",
                                                 "{gaussian_blur: {sigma: -1}}"))
    assert any(":14:26: views.global.per_view[1].gaussian_blur.sigma: expected both ends" in p for p in sigma), sigma


def test_per_view_must_give_one_mapping_per_view_of_ops_the_group_has(tmp_path):
    short = _problems(tmp_path, PIPELINE.replace("      - {}\n", ""))
    assert any("views.global.per_view: expected a list of 2 mappings (one per view" in p for p in short), short
    unknown = _problems(tmp_path, PIPELINE.replace("{horizontal_flip: {probability: 0.25}}",
                                                   "{solarize: {probability: 0.2}}"))
    assert any("views.global.per_view[1].solarize: 'solarize' is not an op of this group (its ops: "
               "random_resized_crop, horizontal_flip, gaussian_blur, normalize)" in p for p in unknown), unknown


def test_a_view_cannot_change_its_groups_output_size(tmp_path):
    problems = _problems(tmp_path, PIPELINE.replace("{horizontal_flip: {probability: 0.25}}",
                                                    "{random_resized_crop: {size: 64}}"))
    assert any("views.global.per_view[1].random_resized_crop.size: a group's views share one output size" in p
               for p in problems), problems


def test_each_groups_chain_is_checked_after_the_shared_ops(tmp_path):
    text = PIPELINE.replace("batch_size: 4\n", "batch_size: 4\nops: [normalize]\n")
    text = text.replace("      - random_resized_crop: {size: 16, scale: [0.05, 0.4]}\n", "      - resize: 16\n")
    problems = _problems(tmp_path, text)
    assert any(":4:7: ops[0]: 'normalize' cannot be a shared op of a pipeline with views" in p for p in problems)
    assert any("views.local.ops: the pipeline's output size is not fixed" in p for p in problems), problems


def test_batch_level_ops_are_refused_in_a_group(tmp_path):
    text = PIPELINE.replace(f"      - normalize: {MEAN_STD}\noutputs",
                            f"      - normalize: {MEAN_STD}\n      - mixup: {{alpha: 0.2}}\noutputs")
    problems = _problems(tmp_path, text)
    assert any("views.local.ops[2]: 'mixup' runs on the whole batch" in p for p in problems), problems


def test_outputs_name_views_exactly_when_the_pipeline_has_them(tmp_path):
    with_image = _problems(tmp_path, PIPELINE.replace("outputs: [views, label]", "outputs: [image, label]"))
    assert any("outputs: a pipeline with views gives its images as the 'views' output" in p for p in with_image)
    assert any("outputs[0]: a pipeline with views has no 'image' output" in p for p in with_image)
    data = {"version": 1, "source": {"type": "folder", "root": "x"}, "batch_size": 2, "ops": [{"center_crop": 8}],
            "outputs": ["views", "label"]}
    with pytest.raises(SpecError, match="the 'views' output needs a views section"):
        spec_from_dict(data)


def test_set_reaches_into_a_groups_ops_count_and_per_view(tmp_path):
    path = _write(tmp_path, PIPELINE)
    spec = load_spec(path, ["views.global.ops.0.random_resized_crop.scale=[0.3, 1.0]",
                            "views.local.count=2", "views.global.per_view.1.horizontal_flip.probability=0.1"])
    assert spec.views[0].ops[0].params["scale"] == [0.3, 1.0]
    assert spec.views[1].count == 2
    assert spec.views[0].view_ops(1)[1].params["probability"] == 0.1
    shorthand = PIPELINE.replace("- horizontal_flip: {probability: 0.5}", "- horizontal_flip")
    shorthand = shorthand.replace("{horizontal_flip: {probability: 0.25}}", "{}")
    spec = load_spec(_write(tmp_path, shorthand), ["views.global.ops.1.horizontal_flip.probability=0.3"])
    assert spec.views[0].ops[1].params == {"probability": 0.3}
    bad = _problems(tmp_path, PIPELINE, ["views.global.count=3"])
    assert any(p.startswith("--set views.global.count=3") or "views.global.per_view: expected a list of 3" in p
               for p in bad), bad


def test_a_change_to_an_op_the_group_has_twice_is_refused_as_ambiguous(tmp_path):
    flip = "      - horizontal_flip: {probability: 0.5}\n"
    text = PIPELINE.replace(flip, flip * 2)
    problems = _problems(tmp_path, text)
    assert any("views.global.per_view[1].horizontal_flip: 'horizontal_flip' appears 2 times in this group's ops"
               in p for p in problems), problems


def test_a_pipeline_with_views_on_the_ray_executor_is_refused_naming_the_local_ones():
    with pytest.raises(SpecError, match=r"loader\.executor: 'ray' runs pipelines of one image per sample.*"
                                         r"use processes or threads"):
        load_spec("simclr_train", {"loader.executor": "ray"})
