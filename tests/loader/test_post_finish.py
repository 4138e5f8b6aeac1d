"""The post-finish stage: ops after the finish run in the loader, leave every step before them (and
pipelines without them) unchanged, and `dali-bridge show` lists them with their device."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from tests.helpers.paths import TRAIN

from dali_bridge.cli.main import main
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.loader.post_finish import PostFinish
from dali_bridge.pipeline.sampling import draws, sample_steps
from dali_bridge.spec.pipeline import load_spec, spec_from_dict


TAIL = [{"random_erasing": {"probability": 0.25, "value": "random"}}, {"batch_mix": {"cutmix_probability": 0.4}}]


def with_tail(spec_data: dict) -> dict:
    return {**spec_data, "ops": spec_data["ops"] + TAIL, "outputs": ["image", "target"]}


def test_ops_after_the_finish_change_no_step_draw_or_stage_before_them():
    plain_data = load_spec(TRAIN).to_dict()
    plain, tailed = build_plan(spec_from_dict(plain_data)), build_plan(spec_from_dict(with_tail(plain_data)))
    assert tailed.steps == plain.steps and tailed.finish_step == plain.finish_step
    indices = np.arange(50)
    plain_draws, tailed_draws = draws(plain, 3, 1, indices), draws(tailed, 3, 1, indices)
    assert all(np.array_equal(plain_draws[k], tailed_draws[k]) for k in plain_draws)
    row = {k: v[7] for k, v in tailed_draws.items()}
    assert sample_steps(tailed, 300, 400, row) == sample_steps(plain, 300, 400, row)
    for backend in ("dali", "dali-cpu", "torchvision"):
        before, after = placement(plain, backend), placement(tailed, backend)
        assert after[:len(before)] == before
        assert [s.stage for s in after[len(before):]] == ["random_erasing", "batch_mix"]


def test_a_pipeline_without_ops_after_the_finish_yields_the_executors_batch_untouched():
    plan = build_plan(load_spec(TRAIN))
    stage = PostFinish(plan, 0, 0, num_classes=3)
    images = torch.randn(2, 3, 4, 4)
    assert not stage.active
    out, target = stage.apply(images, torch.tensor([0, 1]), np.arange(2), epoch=0, number=0)
    assert out is images and target is None


def test_show_lists_the_ops_after_the_finish_with_implementation_and_device(capsys, no_cuda, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(with_tail(yaml.safe_load(TRAIN.read_text()))))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "target: {label_smoothing: 0.0}" in out
    for section, device in (("## dali (", "cuda"), ("## dali-cpu (", "cpu"), ("## torchvision (", "cpu")):
        text = out.split(section)[1].split("\n## ")[0]
        lines = [line for line in text.splitlines() if line.lstrip().startswith(("random_erasing", "batch_mix"))]
        assert len(lines) == 2 and all(f" {device} " in line and "torch:" in line for line in lines), text
    assert "normal noise" in out and "CutMix (alpha 1) with probability 0.4" in out


@pytest.mark.parametrize("number, rank", [(0, 0), (5, 1)])
def test_ranks_and_batches_draw_their_own_mixing(number, rank):
    plan = build_plan(spec_from_dict(with_tail(load_spec(TRAIN).to_dict())))
    images, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    results = [PostFinish(plan, 0, r, num_classes=3, wants_target=True).apply(
        images.clone(), labels, np.arange(4), epoch=0, number=n)[1] for n, r in ((number, rank), (number + 1, rank),
                                                                               (number, rank + 1), (number, rank))]
    assert torch.equal(results[0], results[3])
    assert not torch.equal(results[0], results[1]) and not torch.equal(results[0], results[2])


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread is already the default here")
def test_ops_after_the_finish_run_on_one_intra_op_thread_on_the_host_and_the_callers_count_is_restored(
        monkeypatch):
    plan = build_plan(spec_from_dict(with_tail(load_spec(TRAIN).to_dict())))
    erasing = plan.post_finish[0][1].op
    seen = []
    original = type(erasing).apply_samples

    def counting(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(erasing), "apply_samples", counting)
    before = torch.get_num_threads()
    PostFinish(plan, 0, 0, num_classes=3, wants_target=True).apply(
        torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0]), np.arange(4), epoch=0, number=0)
    assert seen == [1] and torch.get_num_threads() == before
