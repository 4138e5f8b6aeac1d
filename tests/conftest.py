"""Shared fixtures: a small generated sample set and pipeline files written on the fly."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from dali_bridge.loader.select import available_backends

REPO = Path(__file__).resolve().parent.parent
PIPELINES = REPO / "pipelines"
TRAIN = PIPELINES / "imagenet_train.yaml"
VAL = PIPELINES / "imagenet_val.yaml"

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


@pytest.fixture
def no_cuda(monkeypatch):
    """The same answers on every host: CUDA switched off through DALI_BRIDGE_DISABLE."""
    from dali_bridge.loader.select import probe

    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    probe.cache_clear()
    yield
    probe.cache_clear()


def backend_params(names: list[str] = ["dali-cpu", "torchvision", "dali"]) -> list:
    """pytest params over backends, each unavailable one skipped with the reason."""
    from dali_bridge.loader.select import unavailable_reason

    params = []
    for name in names:
        reason = unavailable_reason(name)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """37 natural-looking JPEGs in 3 classes (an odd count, so partial batches happen)."""
    from dali_bridge.data.sources.synthetic import generate_sample_data

    root = tmp_path_factory.mktemp("samples")
    generate_sample_data(root, images=37, classes=3, seed=1, workers=1)
    return root


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory: pytest.TempPathFactory, sample_root: Path) -> Path:
    """Every unusual-image corpus kind (grayscale-origin, CMYK, PNG kinds, 1x1 to 4000x3000; one
    class each) plus 10 generated photo-like JPEGs (class 'natural')."""
    import shutil

    from corpus import write_unusual_images

    root = tmp_path_factory.mktemp("corpus")
    write_unusual_images(root)
    natural = root / "natural"
    natural.mkdir()
    for path in sorted(sample_root.rglob("*.jpg"))[:10]:
        shutil.copy(path, natural / path.name)
    return root


@pytest.fixture
def write_pipeline(tmp_path: Path) -> Callable[..., Path]:
    """Write a pipeline file: a shipped one (by path) with dotted overrides, or raw data."""
    counter = iter(range(10_000))

    def write(base: Path | dict[str, Any] = TRAIN, **overrides: Any) -> Path:
        data = yaml.safe_load(Path(base).read_text()) if not isinstance(base, dict) else dict(base)
        for dotted, value in overrides.items():
            node = data
            parts = dotted.split("__")
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        path = tmp_path / f"pipeline_{next(counter)}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 300, killed: bool = False) -> None:
    """Run ``script`` under ``torchrun --standalone`` with ``nproc`` ranks (the repository and tests/
    importable); fails the test with both streams' tails when it exits non-zero — or, with ``killed``,
    unless its ranks ended by SIGKILL."""
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc_per_node={nproc}", str(script), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    tails = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    if killed:
        assert done.returncode != 0 and "SIGKILL" in done.stderr, f"torchrun's ranks were not killed:\n{tails}"
    else:
        assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{tails}"


# ---- lifecycle helpers: what a loader leaves behind (Linux /proc)

def os_threads() -> int:
    """OS threads of this process (DALI's C++ threads included, unlike threading.enumerate)."""
    return len(os.listdir("/proc/self/task"))


def child_processes() -> list[int]:
    """Live (non-zombie) child processes of this process, from /proc (any launcher, not only multiprocessing)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(entry))
    return found


def settle(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Wait (up to ``timeout`` seconds) for workers and threads to finish shutting down."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
