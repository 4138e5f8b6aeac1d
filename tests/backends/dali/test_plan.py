"""Placement as data: what runs where on each backend, checked without a GPU.

The DALI graph builder is one function for `dali` and `dali-cpu`. Its GPU graph cannot be built
into a runnable pipeline here (no CUDA), but DALI defines the graph in Python before the backend
build step, so the tests build both graphs with the backend step replaced by graph definition only
and compare the operators DALI would run: same operators, same arguments, different devices.
"""
from __future__ import annotations

from collections import Counter

import re
from typing import Any

import numpy as np
import pytest

from tests.helpers.backends import MEAN, STD
from tests.helpers.paths import TRAIN, VAL
from dali_bridge.backends.dali.plan import dali_plan
from dali_bridge.ops.registry import OPS
from dali_bridge.ops.exact_resize import METHODS
from dali_bridge.loader.placement import placement
from dali_bridge.ops.base import Step
from dali_bridge.ops.finish import Finish
from dali_bridge.pipeline.plan import Placed, build_plan, unsupported_ops
from dali_bridge.spec.pipeline import coerce_spec, spec_from_dict



def spec_of(ops: list, decode: str = "mixed", **extra: Any):
    data = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 4,
            "decode": {"device": decode}, "ops": ops, **extra}
    return spec_from_dict(data)


def plan_of(ops: list, decode: str = "mixed"):
    return build_plan(spec_of(ops, decode))


def devices(stages: list[Placed]) -> dict[str, str]:
    return {s.stage: s.device for s in stages}


TRAIN_OPS = [{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"normalize": {"mean": MEAN, "std": STD}}]
VAL_OPS = [{"resize": 256}, {"center_crop": 224}, {"normalize": {"mean": MEAN, "std": STD}}]


# ---------------------------------------------------------------------------------------------
# Plan lowering


def test_train_plan_lowers_to_rrc_flip_and_a_float_finish():
    plan = build_plan(coerce_spec(TRAIN))
    assert [s.name for s in plan.steps] == ["random_resized_crop", "horizontal_flip"]
    assert plan.steps[0].params["size"] == (224, 224) and plan.steps[0].params["scale"] == [0.08, 1.0]
    assert plan.finish == Finish(tuple(MEAN), tuple(STD), "float32", "CHW")
    assert plan.output_size == (224, 224) and plan.output_shape(8) == (8, 3, 224, 224)
    assert plan.random and plan.decode_device == "mixed"


def test_val_plan_has_a_shorter_side_resize_and_a_centre_crop():
    plan = build_plan(coerce_spec(VAL))
    assert [s.name for s in plan.steps] == ["resize", "center_crop"]
    assert plan.steps[0].params["shorter_side"] is True and plan.steps[0].params["size"] == (256,)
    assert plan.steps[1].params == {"size": (224, 224)}
    assert not plan.random


def test_crop_mirror_normalize_lowers_to_centre_crop_flip_and_finish():
    plan = plan_of([{"resize": 256}, {"crop_mirror_normalize": {"crop": [200, 180], "mirror": 0.5, "mean": MEAN,
                                                                "std": STD, "dtype": "float16", "layout": "HWC"}}])
    assert plan.steps[1:] == (Step(OPS["center_crop"], {"size": (200, 180)}, 1),
                              Step(OPS["horizontal_flip"], {"probability": 0.5}, 1))
    assert plan.finish == Finish(tuple(MEAN), tuple(STD), "float16", "HWC")
    assert plan.output_size == (200, 180) and plan.output_shape(2) == (2, 200, 180, 3)


def test_crop_mirror_normalize_without_crop_or_mirror_adds_no_steps():
    plan = plan_of([{"random_resized_crop": 64}, {"crop_mirror_normalize": {"dtype": "uint8"}}])
    assert [s.name for s in plan.steps] == ["random_resized_crop"]
    assert plan.finish.identity and plan.finish.dtype == "uint8"


# ---------------------------------------------------------------------------------------------
# Placement


def test_dali_places_decode_on_mixed_and_every_op_on_the_gpu():
    stages = placement(plan_of(TRAIN_OPS), "dali")
    resize = [("random_resized_crop.resize" + suffix, "gpu") for suffix, _ in METHODS["border_patch"].stages()]
    assert [(s.stage, s.device) for s in stages] == [
        ("read", "cpu"), ("decode", "mixed"), *resize, ("horizontal_flip", "gpu"), ("finish", "gpu"),
        ("finish.border", "gpu"), ("finish.border", "gpu"), ("border_patch", "cuda")]


def test_dali_with_cpu_decode_adds_a_transfer_and_keeps_ops_on_the_gpu():
    stages = placement(plan_of(VAL_OPS, decode="cpu"), "dali")
    assert [(s.stage, s.device) for s in stages] == [
        ("read", "cpu"), ("decode", "cpu"), ("to_gpu", "gpu"), ("resize", "gpu"), ("center_crop", "gpu"),
        ("finish", "gpu")]
    assert stages[2].implementation == ".gpu()"


@pytest.mark.parametrize("ops", [TRAIN_OPS, VAL_OPS], ids=["train", "val"])
@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_dali_cpu_places_everything_on_the_cpu(ops, decode):
    stages = placement(plan_of(ops, decode), "dali-cpu")
    assert {s.device for s in stages} == {"cpu"}
    assert "to_gpu" not in devices(stages)


def test_torchvision_finishes_on_cuda_only_when_the_loader_targets_a_gpu():
    plan = plan_of(TRAIN_OPS)
    on_gpu, on_cpu = placement(plan, "torchvision", cuda=True), placement(plan, "torchvision", cuda=False)
    assert devices(on_gpu)["finish"] == "cuda" and devices(on_cpu)["finish"] == "cpu"
    for stages in (on_gpu, on_cpu):
        assert all(s.device == "cpu" for s in stages if s.stage != "finish")
        assert [s.stage for s in stages] == ["read", "decode", "random_resized_crop", "horizontal_flip", "batch",
                                             "finish"]
    assert "uint8" in on_gpu[4].implementation


def test_torchvision_under_the_threads_executor_says_its_read_runs_in_loader_threads_not_worker_processes():
    plan = plan_of(TRAIN_OPS)
    processes, threads = placement(plan, "torchvision"), placement(plan, "torchvision", executor="threads")
    assert processes[0].implementation.startswith("DataLoader worker")
    assert threads[0].implementation.startswith("loader thread") and "worker queue" not in threads[4].implementation
    assert [(s.stage, s.device) for s in threads] == [(s.stage, s.device) for s in processes]


def roi_decode(plan) -> bool:
    return dali_plan(plan).window_columns is not None


def fused_mirror(plan) -> bool:
    return dali_plan(plan).fused_mirror


def test_roi_decode_only_when_the_first_op_is_a_random_resized_crop():
    assert dali_plan(plan_of(TRAIN_OPS)).window_columns == ("0.crop.anchor", "0.crop.shape")
    assert placement(plan_of(TRAIN_OPS), "dali")[1].implementation.startswith("fn.decoders.image_slice")
    later = plan_of([{"resize": 300}, {"random_resized_crop": 224}, {"normalize": {}}])
    assert not roi_decode(later) and not roi_decode(plan_of(VAL_OPS))
    stages = placement(later, "dali")
    assert stages[1].implementation == "fn.decoders.image"
    exact_resize = [suffix for suffix, _ in METHODS["filter_1pass"].stages()]
    patched = [suffix for suffix, _ in METHODS["border_patch"].stages()]
    assert [s.stage for s in stages][2:] == (["resize" + s for s in exact_resize] + ["random_resized_crop.crop"]
                                             + ["random_resized_crop.resize" + s for s in patched]
                                             + ["finish", "finish.border", "finish.border", "border_patch"])


def test_flip_is_fused_into_crop_mirror_normalize_only_when_last():
    assert fused_mirror(plan_of(TRAIN_OPS))
    assert "fused" in devices_impl(placement(plan_of(TRAIN_OPS), "dali"))["horizontal_flip"]
    middle = plan_of([{"resize": 256}, {"horizontal_flip": 0.5}, {"center_crop": 224}, {"normalize": {}}])
    assert not fused_mirror(middle)
    assert devices_impl(placement(middle, "dali"))["horizontal_flip"] == "fn.flip"
    cmn = plan_of([{"resize": 256}, {"crop_mirror_normalize": {"crop": 224, "mirror": 0.5}}])
    assert fused_mirror(cmn)


def devices_impl(stages: list[Placed]) -> dict[str, str]:
    return {s.stage: s.implementation for s in stages}


def test_placement_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        placement(plan_of(TRAIN_OPS), "cuda")


def test_unsupported_ops_names_the_op_and_its_backends(monkeypatch):
    import dataclasses

    from dali_bridge.ops.registry import OPS

    spec = spec_of(TRAIN_OPS)
    assert unsupported_ops(spec, "torchvision") == []
    monkeypatch.setitem(OPS, "horizontal_flip", dataclasses.replace(OPS["horizontal_flip"],
                                                                    backends=("dali", "dali-cpu")))
    assert unsupported_ops(spec, "torchvision") == [(1, "horizontal_flip", ("dali", "dali-cpu"))]
    assert unsupported_ops(spec, "dali-cpu") == []


# ---------------------------------------------------------------------------------------------
# The DALI graph builder: one graph, only devices differ

def _dali_missing() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except Exception:
        return True
    return False


needs_dali = pytest.mark.skipif(_dali_missing(), reason="needs DALI (nvidia-dali-cuda120) to define DALI graphs")

# Arguments only the mixed (nvJPEG) decoder takes; everything else must be identical on both graphs.
MIXED_ONLY = {"jpeg_fancy_upsampling", "hw_decoder_load", "device_memory_padding", "host_memory_padding"}
# Graph op → the placement implementation it comes from.
DALI_OPS = {"decoders__ImageSlice": "fn.decoders.image_slice", "decoders__Image": "fn.decoders.image",
            "Resize": "fn.resize", "Slice": "fn.slice", "Flip": "fn.flip",
            "CropMirrorNormalize": "fn.crop_mirror_normalize",
            # the torchvision-exact resize methods (ops.exact_resize)
            "Reshape": "fn.reshape", "MultiPaste": "fn.multi_paste", "_ArithmeticGenericOp": "arithmetic",
            "Cast": "fn.cast", "Transpose": "fn.transpose", "Cat": "fn.cat",
            "_TensorSubscript": "subscript", "Stack": "fn.stack", "GaussianBlur": "fn.gaussian_blur"}


def parse_opspec(text: str) -> dict[str, Any]:
    """DALI's printed OpSpec → {op, inputs, outputs, args}, with the source-location arguments dropped."""
    lines = text.splitlines()
    match = re.match(r"OpSpec for (\S+):", lines[0])
    assert match, lines[0]
    op: dict[str, Any] = {"op": match.group(1), "inputs": [], "outputs": [], "args": {}}
    section = None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped in ("Inputs:", "Outputs:", "Arguments:"):
            section = stripped[:-1].lower()
        elif stripped and section in ("inputs", "outputs"):
            op[section].append(stripped)
        elif stripped and section == "arguments":
            key, _, value = stripped.partition(": ")
            if not key.startswith("_origin"):
                op["args"][key] = value
    return op


def dali_graph(monkeypatch, ops: list, *, gpu: bool, decode: str = "mixed") -> list[dict[str, Any]]:
    """The operators the real graph builder defines, without DALI's backend build (which needs CUDA for gpu)."""
    from nvidia.dali.pipeline import Pipeline

    from dali_bridge.backends.dali.feed import Feeder, build_pipeline
    from dali_bridge.data.sources.listing import Listing

    spec = spec_of(ops, decode)
    plan = build_plan(spec)
    listing = Listing(("/nonexistent/a.jpg",), np.zeros(1, dtype=np.int64), ("a",), "/nonexistent")
    with monkeypatch.context() as patch:
        patch.setattr(Pipeline, "build", lambda self: self._build_graph())
        pipe = build_pipeline(spec, plan, Feeder(spec, listing, plan, gpu=gpu), gpu=gpu,
                              device_id=0 if gpu else None, threads=1)
    return [parse_opspec(str(instance.spec)) for instance in pipe._ops]


def _neutral(graph: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A graph with devices erased: device arguments, the _cpu/_gpu edge suffixes and mixed-only hints."""
    out = []
    for op in graph:
        args = {k: v for k, v in op["args"].items() if k != "device" and k not in MIXED_ONLY}
        out.append({"op": op["op"], "args": args,
                    "inputs": [re.sub(r"_(cpu|gpu)$", "", i) for i in op["inputs"]],
                    "outputs": [re.sub(r"_(cpu|gpu)$", "", o) for o in op["outputs"]]})
    return out


PIPELINES = {
    "train": TRAIN_OPS,
    "val": VAL_OPS,
    "flip-in-the-middle": [{"resize": 256}, {"horizontal_flip": 0.5}, {"center_crop": 224}, {"normalize": {}}],
    "rrc-after-resize": [{"resize": 300}, {"random_resized_crop": [200, 160]}, {"normalize": {"dtype": "float16"}}],
    "crop-mirror-normalize": [{"resize": 256}, {"crop_mirror_normalize": {"crop": 224, "mirror": 0.5, "mean": MEAN,
                                                                          "std": STD, "layout": "HWC"}}],
    "vertical-flip-and-grayscale": [{"random_resized_crop": 224}, {"vertical_flip": 0.5}, {"random_grayscale": 0.2},
                                    {"horizontal_flip": 0.5}, {"normalize": {"mean": MEAN, "std": STD}}],
    "nearest-bicubic": [{"resize": {"size": 300, "interpolation": "nearest"}},
                        {"random_resized_crop": {"size": 200, "interpolation": "bicubic"}}, {"normalize": {}}],
    "gaussian-blur": [{"random_resized_crop": 224}, {"gaussian_blur": {"kernel_size": [23, 5]}},
                      {"horizontal_flip": 0.5}, {"normalize": {"mean": MEAN, "std": STD}}],
    "torch-tail-after-a-resize": [{"random_resized_crop": 224}, {"horizontal_flip": 0.5},
                                        {"color_jitter": {"brightness": 0.4, "hue": 0.1}}, {"vertical_flip": 0.5},
                                        {"normalize": {"mean": MEAN, "std": STD}}],
    "torch-tail-from-the-first-step": [{"trivial_augment_wide": {}}, {"resize": 256}, {"center_crop": 224},
                                       {"normalize": {"dtype": "float16", "layout": "HWC"}}],
}


@needs_dali
@pytest.mark.parametrize("name", list(PIPELINES))
def test_dali_and_dali_cpu_graphs_differ_only_in_devices(monkeypatch, name):
    cpu_graph = dali_graph(monkeypatch, PIPELINES[name], gpu=False)
    gpu_graph = dali_graph(monkeypatch, PIPELINES[name], gpu=True)
    if dali_plan(plan_of(PIPELINES[name])).tail_window_columns(gpu=False):
        # dali-cpu alone decodes the window of the torch tail's first crop: its decoder (and the window's
        # two columns) differ, the operators after it do not
        decoders = [[op["op"] for op in graph if op["op"].startswith("decoders__")] for graph in (cpu_graph, gpu_graph)]
        assert decoders == [["decoders__ImageSlice"], ["decoders__Image"]]
        rest = [[op["op"] for op in _neutral(graph) if not op["op"].startswith(("decoders__", "ExternalSource"))]
                for graph in (cpu_graph, gpu_graph)]
        assert rest[0] == rest[1]
    else:
        assert _neutral(cpu_graph) == _neutral(gpu_graph)
    for op in cpu_graph:
        assert op["args"]["device"] == "cpu" and not (set(op["args"]) & MIXED_ONLY)
    for op in gpu_graph:
        if op["op"] == "ExternalSource":
            assert op["args"]["device"] == "cpu"          # the feeder's columns enter on the host
        elif op["op"].startswith("decoders__"):
            assert op["args"]["device"] == "mixed"
            assert op["args"]["jpeg_fancy_upsampling"] == "True"   # libjpeg-turbo's chroma upsampling
            assert set(op["args"]) >= MIXED_ONLY
        else:
            assert op["args"]["device"] == "gpu", op
            assert op["outputs"][0].endswith("_gpu") and op["inputs"][0].endswith("_gpu")


@needs_dali
@pytest.mark.parametrize("name", list(PIPELINES))
@pytest.mark.parametrize("backend", ["dali", "dali-cpu"])
def test_dali_graph_operators_are_what_placement_says(monkeypatch, name, backend):
    """placement() is the graph's description: the same operators on the same devices, in the same order
    along the image's own chain (DALI lists a border patch's side branches interleaved with it)."""
    graph = dali_graph(monkeypatch, PIPELINES[name], gpu=backend == "dali")
    ran = [(DALI_OPS[op["op"]], op["args"]["device"]) for op in graph if op["op"] != "ExternalSource"]
    stages = placement(plan_of(PIPELINES[name]), backend)
    dali_stages = [s for s in stages if s.stage not in ("read", "to_gpu", "border_patch")
                   and not s.implementation.startswith(("fused", "torch after DALI"))]
    described = [(s.implementation.split(" ")[0], s.device) for s in dali_stages]
    assert Counter(ran) == Counter(described)
    chain = [(s.implementation.split(" ")[0], s.device) for s in dali_stages if ".border" not in s.stage]
    remaining = iter(ran)
    assert all(op in remaining for op in chain)  # in order (a subsequence)
    if chain == described:
        assert ran == described


def test_shipped_training_pipeline_patches_only_its_border_lines_in_torch():
    stages = placement(plan_of(TRAIN_OPS), "dali-cpu")
    assert stages[-1].stage == "border_patch" and stages[-1].implementation.startswith("torch:")
    assert stages[2].implementation.startswith("fn.resize (antialias")  # the image itself: one plain resize
    assert sum(s.implementation.startswith("fn.resize") for s in stages) == 1 + 4  # the image, four edge strips


@needs_dali
def test_dali_cpu_decode_on_the_gpu_backend_decodes_on_the_host_then_moves(monkeypatch):
    graph = dali_graph(monkeypatch, VAL_OPS, gpu=True, decode="cpu")
    decoder = next(op for op in graph if op["op"].startswith("decoders__"))
    assert decoder["args"]["device"] == "cpu" and not (set(decoder["args"]) & MIXED_ONLY)
    resize = next(op for op in graph if op["op"] == "Resize")
    assert resize["args"]["device"] == "gpu" and resize["inputs"][0].endswith("_gpu")


@needs_dali
def test_dali_finish_converts_mean_and_std_to_pixel_levels(monkeypatch):
    graph = dali_graph(monkeypatch, TRAIN_OPS, gpu=False)
    cmn = next(op for op in graph if op["op"] == "CropMirrorNormalize")
    mean = [float(v) for v in cmn["args"]["mean"].strip("[], ").split(",") if v.strip()]
    std = [float(v) for v in cmn["args"]["std"].strip("[], ").split(",") if v.strip()]
    np.testing.assert_allclose(mean, [m * 255 for m in MEAN], rtol=1e-6)
    np.testing.assert_allclose(std, [s * 255 for s in STD], rtol=1e-6)
    assert cmn["args"]["output_layout"] == "CHW"
    # the flip is the last step: its per-sample flag is the mirror argument input of crop_mirror_normalize
    assert len(cmn["inputs"]) == 2 and cmn["inputs"][1].startswith("__ExternalSource")
    assert not any(op["op"] == "Flip" for op in graph)


@needs_dali
def test_dali_cpu_pipeline_builds_and_runs_here(sample_root):
    from dali_bridge.backends.dali.feed import Feeder, build_pipeline
    from dali_bridge.pipeline.sampling import rank_batches
    from dali_bridge.data.sources.local import list_source

    spec = coerce_spec(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4})
    plan, listing = build_plan(spec), list_source(spec.source)
    feeder = Feeder(spec, listing, plan, gpu=False)
    pipe = build_pipeline(spec, plan, feeder, gpu=False, device_id=None, threads=1)
    feeder.start(rank_batches(len(listing), 4, 0, 0)[:1])
    images, rows, cols = pipe.run()  # the image and its exact border lines (a border patch)
    batch = np.asarray(images.as_tensor())
    assert batch.shape == (4, 3, 224, 224) and batch.dtype == np.float32
    assert np.asarray(rows.as_tensor()).shape == (4, 3, 2, 224) and np.asarray(cols.as_tensor()).shape == (4, 3, 222, 2)
    assert feeder.pending.popleft().outcome.rows == [0, 1, 2, 3]
