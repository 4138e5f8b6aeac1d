"""Pipelines with views on every backend: each batch a list of [N, C, H, W] views in declared order,
every view cut from one decode with the pixels of decoding it alone, the same pixels on every CPU
backend, and the loader's guarantees (len, last_batch, on_error and its accounting) with views."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.pipeline.region_decode import decode_steps
from dali_bridge.pipeline.sampling import draws, sample_steps
from dali_bridge.data.sources.formats import inspect_image
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.backends.torchvision import apply_steps
from tests.helpers.backends import backend_params, needs_cpu_backends

SAMPLES = 9


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from tests.helpers.hostile import write_image_folder

    folder = tmp_path_factory.mktemp("views")
    write_image_folder(folder, classes=1, per_class=SAMPLES)
    return folder


def pipeline(root: Path, *, jitter: bool = False, **loader) -> dict:
    """Two global views (the second flips less) and three local ones, finished as uint8: pixels compare exactly."""
    colour = [{"color_jitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.2, "hue": 0.1}}] if jitter else []
    return {"version": 1, "name": "views", "source": {"type": "folder", "root": str(root)}, "batch_size": 4,
            "seed": 5,
            "views": {
                "global": {"count": 2, "ops": [{"random_resized_crop": {"size": 24, "scale": [0.4, 1.0],
                                                                        "interpolation": "bicubic"}},
                                               {"horizontal_flip": {"probability": 0.5}}, *colour,
                                               {"gaussian_blur": {"kernel_size": 5, "sigma": [0.1, 2.0]}},
                                               {"normalize": {"dtype": "uint8"}}],
                           "per_view": [{}, {"horizontal_flip": {"probability": 0.1}}]},
                "local": {"count": 3, "ops": [{"random_resized_crop": {"size": 12, "scale": [0.05, 0.4]}},
                                              {"horizontal_flip": {}}, {"normalize": {"dtype": "uint8"}}]}},
            "outputs": ["views", "label", "index"],
            "loader": {"workers": 0, "shuffle": False, **loader}}


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_each_batch_gives_every_view_in_declared_order_with_label_and_index(root, backend):
    with build_loader(pipeline(root), backend) as loader:
        batches = list(loader)
    assert len(batches) == len(loader) == 3
    for views, labels, index in batches:
        assert [tuple(v.shape[1:]) for v in views] == [(3, 24, 24)] * 2 + [(3, 12, 12)] * 3
        assert all(v.dtype == torch.uint8 and len(v) == len(labels) == len(index) for v in views)
    assert torch.cat([index for _, _, index in batches]).tolist() == list(range(SAMPLES))
    first = batches[0][0]
    assert not torch.equal(first[2], first[3])  # each view its own crop


def test_every_view_is_cut_from_one_decode_and_equals_decoding_it_alone(root, monkeypatch):
    import dali_bridge.backends.torchvision as torchvision_backend

    decoded = []
    original = torchvision_backend.decode_checked
    monkeypatch.setattr(torchvision_backend, "decode_checked", lambda data: decoded.append(1) or original(data))
    spec = spec_from_dict(pipeline(root))
    with build_loader(spec, "torchvision") as loader:
        batches = list(loader)
        paths = loader.listing.paths
    assert len(decoded) == SAMPLES  # one decode per sample, for all five views
    plan = build_plan(spec)
    for views, _, index in batches:
        for v, view in enumerate(plan.views):
            found = draws(view, spec.seed, 0, index.numpy())
            for row, sample in enumerate(index.tolist()):
                data = Path(paths[sample]).read_bytes()
                info = inspect_image(data)
                steps = sample_steps(view, *info.size, {pos: values[row] for pos, values in found.items()})
                image, steps = decode_steps(data, info=info, plan=view, per_step=steps)  # this view's window alone
                assert torch.equal(apply_steps(image, view, steps), views[v][row]), (v, sample)


@needs_cpu_backends
@pytest.mark.parametrize("jitter", [False, True], ids=["graph", "torch-tail"])
def test_dali_cpu_gives_torchvisions_pixels_for_every_view(root, jitter):
    from dali_bridge.tools.compare import compare

    result = compare(pipeline(root, jitter=jitter, workers=1), ("dali-cpu", "torchvision"), batches=None)
    assert result.passed, result.format()
    assert [o.name for o in result.outputs if not o.exact] == [f"views[{n}]" for n in range(5)]
    assert result.samples == SAMPLES


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
@pytest.mark.parametrize("last_batch, lengths", [("partial", [4, 4, 1]), ("drop", [4, 4]), ("pad", [4, 4, 4])])
def test_len_and_last_batch_hold_with_views(root, backend, last_batch, lengths):
    with build_loader(pipeline(root, last_batch=last_batch), backend) as loader:
        batches = list(loader)
        assert len(loader) == len(lengths)
    assert [len(index) for _, _, index in batches] == lengths
    assert all(len(view) == length for (views, _, _), length in zip(batches, lengths) for view in views)


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_a_sample_that_cannot_be_read_is_left_out_of_every_view_and_counted_once(root, tmp_path, backend):
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(root, copy)
    broken = sorted((copy / "class_0").iterdir())[1]
    broken.write_bytes(broken.read_bytes()[:40])   # a truncated JPEG
    with build_loader(pipeline(copy, on_error="skip"), backend) as loader:
        batches = list(loader)
        skipped = list(loader.skipped)
    assert [item.index for item in skipped] == [1]
    views, _, index = batches[0]
    assert index.tolist() == [0, 2, 3] and all(len(view) == 3 for view in views)
    with build_loader(pipeline(copy), backend) as loader, pytest.raises(Exception, match="img_001"):
        list(loader)


def test_a_group_of_one_view_draws_apart_from_the_same_chain_without_views(root):
    """A view's draws key on its view number: its pixels are not the single-image pipeline's."""
    data = pipeline(root)
    single = {**data, "ops": data["views"]["local"]["ops"], "outputs": ["image", "label", "index"]}
    del single["views"]
    with build_loader(single, "torchvision") as loader:
        images = next(iter(loader))[0]
    with build_loader(pipeline(root), "torchvision") as loader:
        views = next(iter(loader))[0]
    assert not any(torch.equal(images, view) for view in views[2:])
    assert np.array_equal(images.shape, views[2].shape)


@pytest.mark.slow  # an epoch of each recipe's ten views on two backends
@needs_cpu_backends
@pytest.mark.parametrize("name", ["simclr_train", "byol_train", "dino_train"])
def test_the_shipped_recipes_give_torchvisions_pixels_on_dali_cpu_for_every_view(sample_root, name):
    from dali_bridge.tools.compare import compare

    result = compare(name, ("dali-cpu", "torchvision"), batches=None,
                     overrides={"source.root": str(sample_root), "batch_size": 8, "loader.workers": 1})
    assert result.passed and result.samples == 32, result.format()   # 37 samples, the last batch dropped
    views = 10 if name == "dino_train" else 2
    assert [o.name for o in result.outputs if not o.exact] == [f"views[{n}]" for n in range(views)]
