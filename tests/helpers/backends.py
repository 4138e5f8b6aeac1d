"""Which backends this host runs, parameters over them, and facts of the host's kernels."""
from __future__ import annotations

import pytest
from dali_bridge.loader.select import available_backends


# Backends that run on this host; the GPU `dali` backend joins where CUDA and DALI exist.
HOST_BACKENDS = available_backends()


CPU_BACKENDS = [b for b in ("dali-cpu", "torchvision") if b in HOST_BACKENDS]


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet's, as the shipped pipelines


needs_cpu_backends = pytest.mark.skipif(CPU_BACKENDS != ["dali-cpu", "torchvision"],
                                        reason=f"needs dali-cpu and torchvision; this host has {CPU_BACKENDS}")


def torch_vector_kernels() -> bool:
    """Whether torch runs its vectorised CPU kernels (AVX2 or AVX-512 here). Under its default ones
    (``ATEN_CPU_CAPABILITY=default``, or a CPU without AVX2) torchvision's uint8 resize rounds like
    DALI's (the mean difference falls from ~0.14 to ~1e-4 levels) and its rgb_to_grayscale rounds a
    few colours one level apart: figures measured on the vectorised kernels hold only there."""
    import torch

    return torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def plan_of(ops: list, parity: str = "exact"):
    """The plan of ``ops`` over a source that is never listed (plans need no files)."""
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import spec_from_dict

    return build_plan(spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"},
                                      "batch_size": 2, "ops": ops, "parity": parity}))


def backend_params(names: list[str] = ["dali-cpu", "torchvision", "dali"]) -> list:
    """pytest params over backends, each unavailable one skipped with the reason."""
    from dali_bridge.loader.select import unavailable_reason

    params = []
    for name in names:
        reason = unavailable_reason(name)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def gpu_graph_ops(ops: list) -> list[str]:
    """The first line of each DALI operator the plan of ``ops``' second step defines on the GPU device,
    its fragment beside its plain-DALI baseline (defined, not run: no CUDA needed); fails where the
    GPU's arithmetic would read data that is not on the GPU."""
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of(ops)
    step, ctx = plan.steps[1], graph_context(plan, "gpu")
    ctx.position = 1

    @pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def graph():
        image = fn.external_source(name="image", layout="HWC", device="gpu")
        columns = {c.name: fn.external_source(name=c.name) for c in step.op.dali_columns(step, ctx)}
        return step.op.dali_graph(step, image, columns, ctx), step.op.dali_baseline(step, image, ctx)

    pipe = graph()
    pipe._build_graph()
    specs = [str(op.spec) for op in pipe._ops]
    for spec in specs:  # arithmetic on the GPU reads GPU data only
        if spec.startswith("OpSpec for _ArithmeticGenericOp") and "device: gpu" in spec:
            inputs = spec.split("Inputs:", 1)[1].split("Outputs:", 1)[0].split()
            assert inputs and all(name.endswith("_gpu") for name in inputs), spec
    return [spec.splitlines()[0] for spec in specs]
