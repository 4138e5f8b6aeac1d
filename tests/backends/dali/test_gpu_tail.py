"""The torch tail on a DALI backend (the ops that run as torchvision kernels after the DALI graph):
nothing per sample crosses between host and device, and on a GPU it runs on a side stream the
consumer's stream waits for. Counted on a CPU host (``dali-cpu`` runs the same tail code), the
stream order pinned with fakes; what only a GPU shows is in test_gpu.py and device_check's sync check.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers.backends import backend_params, plan_of
from dali_bridge import build_loader
from dali_bridge.backends.dali.tail import run_tail
from dali_bridge.ops import batched
from dali_bridge.backends.device import InFlightCopies, TailStream
from tests.helpers.hostile import write_image_folder
from dali_bridge.pipeline.sampling import draw_count

DALI_CPU = backend_params(["dali-cpu"])
TAILS = {
    "augmix": {"augmix": {"severity": 3, "mixture_width": 3}},
    "timm-rand-augment": {"rand_augment": {"variant": "timm", "num_ops": 2, "magnitude": 9}},
    "trivial-augment": {"trivial_augment_wide": {}},
}


class DeviceCopies:
    """Counts the calls made from the bridge's own code that move data between devices: ``Tensor.to``
    with a device, ``Tensor.cpu``/``cuda``, ``torch.tensor``/``as_tensor`` given a device."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for owner, name, moves in ((torch.Tensor, "to", self._to_moves), (torch.Tensor, "cpu", None),
                                   (torch.Tensor, "cuda", None), (torch, "tensor", self._names_device),
                                   (torch, "as_tensor", self._names_device)):
            monkeypatch.setattr(owner, name, self._counting(getattr(owner, name), name, moves))

    @staticmethod
    def _to_moves(args, kwargs) -> bool:
        return "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args)

    @staticmethod
    def _names_device(args, kwargs) -> bool:
        return kwargs.get("device") is not None

    def _counting(self, real, name, moves):
        def call(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            moved = moves is None or moves(args[1:] if name == "to" else args, kwargs)
            if "dali_bridge" in Path(caller).parts and moved:
                self.calls.append(f"{name} from {Path(caller).name}:{sys._getframe(1).f_lineno}")
            return real(*args, **kwargs)
        return call


def tail_pipeline(root: Path, op: dict[str, Any], batch_size: int) -> dict[str, Any]:
    return {"version": 1, "name": "tail", "source": {"type": "folder", "root": str(root)}, "batch_size": batch_size,
            "seed": 2, "ops": [{"random_resized_crop": {"size": 32}}, op, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index"], "loader": {"workers": 1, "shuffle": False}}


@pytest.mark.parametrize("backend", DALI_CPU)
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_the_torch_tail_makes_no_device_copy_per_sample(tmp_path, monkeypatch, backend, tail):
    write_image_folder(tmp_path / "data", classes=2, per_class=4)
    per_batch = {}
    for batch_size in (2, 8):
        loader = build_loader(tail_pipeline(tmp_path / "data", TAILS[tail], batch_size), backend)
        with monkeypatch.context() as patch:  # a whole epoch: dali-cpu converts the next batch ahead, in a thread
            copies = DeviceCopies(patch)
            batches = sum(1 for _ in loader)
        per_batch[batch_size] = (len(copies.calls) / batches, copies.calls)
        loader.close()
    # The same few per batch (the labels' and indices' own), whatever the batch holds.
    assert per_batch[8][0] == per_batch[2][0], per_batch


class Recorder:
    """A fake CUDA stream API that logs the order of what the tail stream asks for."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def stream(self, name: str) -> Any:
        recorder = self

        class FakeStream:
            def __repr__(self) -> str:
                return name

            def wait_event(self, event) -> None:
                recorder.log.append(f"{name} waits for {event}")

            def __enter__(self):
                recorder.log.append(f"enter {name}")

            def __exit__(self, *exc) -> None:
                recorder.log.append(f"leave {name}")

        return FakeStream()


def test_a_gpu_tail_runs_on_its_side_stream_and_the_consumer_waits_for_it_alone(monkeypatch):
    recorder = Recorder()
    side, consumer = recorder.stream("side"), recorder.stream("consumer")

    class FakeEvent:
        def record(self, stream) -> None:
            recorder.log.append(f"event recorded on {stream}")

        def query(self) -> bool:
            return False

        def __repr__(self) -> str:
            return "the tail's event"

    class FakeOutput:
        device = torch.device("cuda", 0)

        def record_stream(self, stream) -> None:
            recorder.log.append(f"output recorded on {stream}")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: stream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    tail_stream = TailStream(torch.device("cuda", 0))
    in_flight = InFlightCopies()
    dali_outputs = object()
    output = tail_stream.run(lambda: recorder.log.append("tail kernels") or FakeOutput(), dali_outputs, in_flight)
    assert isinstance(output, FakeOutput)
    assert recorder.log == ["enter side", "tail kernels", "event recorded on side", "leave side",
                            "consumer waits for the tail's event", "output recorded on consumer"]
    assert in_flight.pending[0][1] is dali_outputs   # DALI's buffers stay alive until the tail has run


class HostToDevice(TorchDispatchMode):
    """Counts the copies from host memory onto another device, whoever asks (the bridge or torchvision):
    aten's copies from a CPU tensor, and ``torch.tensor``/``as_tensor`` made on a device (their copy
    runs below the dispatcher's Python key, so those two are patched)."""

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.copies = 0
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, self._counting(getattr(torch, name)))

    def _counting(self, real):
        def call(*args, **kwargs):
            device = kwargs.get("device")
            self.copies += device is not None and torch.device(device).type != "cpu"
            return real(*args, **kwargs)
        return call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            device = kwargs.get("device")
            self.copies += args[0].device.type == "cpu" and device is not None and device.type != "cpu"
        elif func is torch.ops.aten.copy_.default:
            self.copies += args[0].device.type != "cpu" and args[1].device.type == "cpu"
        return func(*args, **kwargs)


TAIL_OPS = {  # every op with a batch kernel, as the tail meets them
    "trivial_augment_wide": {"interpolation": "bilinear", "fill": [128, 0, 255]},
    "rand_augment": {"num_ops": 3, "magnitude": 9},
    "auto_augment": {},
    "augmix": {"severity": 3, "mixture_width": 3},
    "color_jitter": {"brightness": 0.6, "contrast": 0.6, "saturation": 0.6, "hue": 0.3},
    "random_grayscale": {"probability": 0.5},
    "gaussian_blur": {"kernel_size": 5, "sigma": [0.1, 2.0]},
}
SIZE = (40, 48)


@pytest.mark.parametrize("rounding", ["fused", "unfused"])
@pytest.mark.parametrize("name", sorted(TAIL_OPS))
def test_the_batched_tail_on_a_device_copies_per_operation_drawn_not_per_sample(monkeypatch, name, rounding):
    # The meta device stands in for a GPU: every kernel runs (shapes only) and any host memory it is
    # given must be copied there. A batch of 32 drawing the same operations as one of 8, four times
    # each, makes the same copies: a per-sample .to(device) or torch.tensor(..., device=...) fails this.
    monkeypatch.setitem(batched._ADD_ROUNDING, torch.device("meta"), rounding)   # what a GPU's probe answers
    plan = plan_of([{"random_resized_crop": {"size": list(SIZE)}}, {name: TAIL_OPS[name]}])
    step = next(step for step in plan.steps if step.name == name)
    uniforms = np.random.default_rng(4).random((8, draw_count(step)))
    concrete = [step.op.sample(step.params, u, *SIZE) for u in uniforms]
    copies = {}
    for count in (8, 32):
        images = torch.empty((count, 3, *SIZE), dtype=torch.uint8, device="meta")
        drawn = [[(c, SIZE)] for c in concrete * (count // 8)]
        with monkeypatch.context() as patch, HostToDevice(patch) as counted:
            assert run_tail([step], images, drawn).shape == images.shape
        copies[count] = counted.copies
    assert copies[32] == copies[8], f"copies {copies}"


def test_the_copy_count_sees_a_per_sample_copy_slipped_into_a_batch_kernel(monkeypatch):
    # The check above, against a tail that copies each sample's factor on its own: it must fail.
    def each_on_its_own(values, like, dtype=torch.float32):
        return torch.stack([torch.tensor(float(v), dtype=dtype, device=like.device) for v in values]).view(-1, 1, 1, 1)

    monkeypatch.setattr(batched, "per_sample", each_on_its_own)
    with pytest.raises(AssertionError, match="copies"):
        test_the_batched_tail_on_a_device_copies_per_operation_drawn_not_per_sample(monkeypatch, "color_jitter",
                                                                                    "fused")


class DenseOutput:
    """DALI's uint8 CHW output of one size, as the executor's tail reads it (a tensor behind DLPack)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def is_dense_tensor(self) -> bool:
        return True

    def as_tensor(self) -> torch.Tensor:
        return self.tensor


@pytest.mark.parametrize("backend", DALI_CPU)   # the DALI executor, built for a GPU that the meta device stands in for
@pytest.mark.parametrize("name", ["trivial_augment_wide", "augmix", "color_jitter"])
def test_a_gpu_dali_executors_tail_and_finish_copy_per_operation_drawn_not_per_sample(tmp_path, monkeypatch,
                                                                                      backend, name):
    from dali_bridge.backends.dali import executor as dali_backend
    from dali_bridge.backends.base import Topology
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.spec.pipeline import coerce_spec

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    spec = coerce_spec({"version": 1, "source": {"type": "folder", "root": str(tmp_path / "data")}, "batch_size": 8,
                        "parity": "fast", "ops": [{"random_resized_crop": {"size": list(SIZE)}},
                                                  {name: TAIL_OPS[name]}, {"normalize": {}}]})
    plan = build_plan(spec)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: f"side stream of {device}")
    executor = dali_backend.DaliExecutor(spec, list_source(spec.source), plan, gpu=True, topology=Topology(0, 1, 0))
    meta = torch.device("meta")
    executor.tail.device = executor.tail.target = meta   # where the tail and the finish run: the "GPU"
    monkeypatch.setitem(batched._ADD_ROUNDING, meta, "fused")
    monkeypatch.setattr(torch, "from_dlpack", lambda tensor: tensor)
    uniforms = np.random.default_rng(5).random((8, sum(draw_count(s) for s in executor.tail.steps)))
    drawn = []
    for u in uniforms:   # each sample's (concrete parameters, size) per tail step
        steps, start = [], 0
        for step in executor.tail.steps:
            count = draw_count(step)
            steps.append((step.op.sample(step.params, u[start:start + count], *SIZE), SIZE))
            start += count
        drawn.append(steps)
    executor.tail.run([DenseOutput(torch.empty((8, *SIZE, 3), dtype=torch.uint8, device=meta))], drawn)
    copies = {}
    for count in (8, 32):   # after a first batch (the finish makes its mean and std on a device once)
        images = DenseOutput(torch.empty((count, *SIZE, 3), dtype=torch.uint8, device=meta))
        with monkeypatch.context() as patch, HostToDevice(patch) as counted:
            out = executor.tail.run([images], drawn * (count // 8))
        assert out.device == meta and out.dtype == torch.float32 and out.shape == (count, 3, *SIZE)
        copies[count] = counted.copies
    assert copies[32] == copies[8], f"copies {copies}"


@pytest.mark.parametrize("value", [0.5, "random"])
def test_random_erasing_on_a_device_copies_its_fills_once_per_batch_not_per_erased_sample(monkeypatch, value):
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.loader.post_finish import PostFinish
    from dali_bridge.spec.pipeline import spec_from_dict

    spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 32,
                           "ops": [{"center_crop": list(SIZE)}, "normalize",
                                   {"random_erasing": {"probability": 1.0, "value": value}}]})
    post = PostFinish(build_plan(spec), 0, 0, num_classes=1)
    meta = torch.device("meta")
    copies = {}
    for count in (8, 32):
        images = torch.empty((count, 3, *SIZE), dtype=torch.float32, device=meta)
        with HostToDevice(monkeypatch) as counter:
            post.apply(images, torch.empty(count, dtype=torch.int64, device=meta), np.arange(count), epoch=0, number=0)
        copies[count] = counter.copies
    assert copies[8] == copies[32] == 1
