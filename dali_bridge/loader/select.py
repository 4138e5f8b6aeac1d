"""Which backends can run on this host, what ``auto`` picks — every answer with its reason — and
the executor that runs the chosen one."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from ..util.messages import package_log

if TYPE_CHECKING:  # torch is imported when a device is checked or an executor built, not to probe
    import torch

    from ..pipeline.plan import Plan
    from ..data.sources.listing import Listing
    from ..spec.pipeline import PipelineSpec
    from ..backends.base import Executor, Topology

log = package_log()

BACKEND_NAMES = ("dali", "dali-cpu", "torchvision")


class BackendUnavailable(RuntimeError):
    """An explicitly requested backend cannot run here; the message says why."""


@dataclass(frozen=True)
class Probe:
    """What this host offers: each ``*_reason`` is None when the piece is usable."""
    dali_version: str | None
    dali_reason: str | None
    cuda_devices: int
    cuda_reason: str | None
    torchvision_reason: str | None
    # Why a GPU pipeline could not be built and run here although DALI loads libcuda (a DALI
    # build newer than the driver, say). The real probe leaves it None and sets
    # ``check_gpu_pipeline``: a tiny pipeline is then built once per process, only when the
    # ``dali`` backend's availability is asked (a forced torchvision never touches the GPU).
    dali_gpu_reason: str | None = None
    check_gpu_pipeline: bool = False


_DALI_DISABLED = "DALI disabled by DALI_BRIDGE_DISABLE"
# pyproject's extras, one DALI build each: dali-bridge[cuda12] adds nvidia-dali-cuda120, [cuda13] nvidia-dali-cuda130.
DALI_EXTRAS = {12: "cuda12", 13: "cuda13"}


def dali_extra(cuda_major: int | None) -> str:
    """The extra whose DALI build runs with CUDA ``cuda_major`` (torch's here); for none (a CPU build
    of torch: either DALI build runs dali-cpu) the newest; for a major without one, the nearest."""
    if cuda_major in DALI_EXTRAS:
        return DALI_EXTRAS[cuda_major]
    oldest = min(DALI_EXTRAS)
    return DALI_EXTRAS[oldest if cuda_major is not None and cuda_major < oldest else max(DALI_EXTRAS)]


def dali_missing_reason(cuda_devices: int) -> str:
    """Why the DALI backends cannot run where DALI is not installed, and the one install line that
    adds it: the extra for the CUDA major torch is built for (on a GPU host, one the driver runs)."""
    try:
        import torch
        major = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    except Exception:  # torch missing or broken: torchvision's own reason says so
        major = None
    extra = dali_extra(major)
    if cuda_devices and major is not None:
        return (f"DALI not installed: pip install 'dali-bridge[{extra}]' adds its CUDA {major} build, the CUDA "
                f"this host's torch and driver run")
    return f"DALI not installed: pip install 'dali-bridge[{extra}]' adds it"


def _disabled() -> set[str]:
    """The pieces ``DALI_BRIDGE_DISABLE`` switches off (``dali``, ``cuda``, ``torchvision``)."""
    return {p.strip() for p in os.environ.get("DALI_BRIDGE_DISABLE", "").split(",") if p.strip()}


def _probe_key() -> tuple[int, str, str | None]:
    """What a probe's answer holds for: this process (a forked child, which may see a working GPU
    where its parent's probe failed, probes again) and the settings it read (``DALI_BRIDGE_DISABLE``,
    ``CUDA_VISIBLE_DEVICES``)."""
    return os.getpid(), os.environ.get("DALI_BRIDGE_DISABLE", ""), os.environ.get("CUDA_VISIBLE_DEVICES")


_PROBES: dict[tuple, Probe] = {}  # by _probe_key


def probe() -> Probe:
    """Probe DALI, CUDA and torchvision once per process and settings (``DALI_BRIDGE_DISABLE``
    simulates absences): see :func:`_probe_key`."""
    key = _probe_key()
    if key not in _PROBES:
        _PROBES[key] = _probe_now()
    return _PROBES[key]


def _probe_now() -> Probe:
    disabled = _disabled()
    dali_version = dali_reason = None
    if "dali" in disabled:
        dali_reason = _DALI_DISABLED
    else:
        try:
            import nvidia.dali as dali
            dali_version = dali.__version__
        except ImportError as exc:
            # Only nvidia.dali itself missing means "not installed"; a library or module it needs
            # that fails to load is a broken install, said with its own message.
            if exc.name in ("nvidia", "nvidia.dali"):
                dali_reason = dali_missing_reason(torch_cuda_devices()[0])
            else:
                dali_reason = f"DALI failed to import: {type(exc).__name__}: {exc}"
        except Exception as exc:  # a broken install raises OSError & co. while loading its libraries
            dali_reason = f"DALI failed to import: {type(exc).__name__}: {exc}"
    cuda_devices, cuda_reason = torch_cuda_devices()
    if dali_version and cuda_devices and "dali" not in disabled:
        try:
            from nvidia.dali.backend import GetCudaVersion
            if GetCudaVersion() <= 0:
                cuda_reason = f"DALI {dali_version} cannot load libcuda"
        except Exception as exc:
            cuda_reason = f"DALI {dali_version} cannot use CUDA: {exc}"
    return Probe(dali_version, dali_reason, cuda_devices, cuda_reason, torchvision_reason(),
                 check_gpu_pipeline=bool(dali_version and cuda_devices and cuda_reason is None))


def torch_cuda_devices() -> tuple[int, str | None]:
    """The CUDA devices torch sees, and why none when there are none: the part of :func:`probe`
    that needs no DALI. The ``torchvision`` backend asks only this (importing DALI would cost its
    loader a quarter of a second before the first batch)."""
    if "cuda" in _disabled():
        return 0, "CUDA disabled by DALI_BRIDGE_DISABLE"
    try:
        import torch
        if not torch.cuda.is_available():
            return 0, "no CUDA device"
        return torch.cuda.device_count(), None
    except Exception as exc:
        return 0, f"CUDA unusable: {type(exc).__name__}: {exc}"


def torchvision_reason() -> str | None:
    """Why torchvision cannot be used here, or None: the part of :func:`probe` the ``torchvision``
    backend needs."""
    if "torchvision" in _disabled():
        return "torchvision disabled by DALI_BRIDGE_DISABLE"
    try:
        import torchvision  # noqa: F401
    except Exception as exc:
        return f"torchvision failed to import: {exc}"
    return None


def dali_build() -> str:
    """The installed DALI distribution(s) and version, e.g. ``nvidia-dali-cuda120 2.4.0``."""
    try:
        from importlib.metadata import distributions
        builds = sorted(f"{d.metadata['Name']} {d.version}" for d in distributions()
                        if (d.metadata["Name"] or "").lower().startswith("nvidia-dali"))
    except Exception:
        builds = []
    return ", ".join(builds) or "unknown DALI build"


def cuda_driver() -> str:
    """The CUDA version the installed driver supports, as DALI reads it (e.g. ``CUDA 12.4``)."""
    try:
        from nvidia.dali.backend import GetCudaVersion
        version = int(GetCudaVersion())
    except Exception as exc:
        return f"unknown ({type(exc).__name__}: {exc})"
    return f"CUDA {version // 1000}.{version % 1000 // 10}" if version > 0 else "no usable libcuda"


def _build_tiny_gpu_pipeline(device_id: int) -> None:
    """Build and run a one-image pipeline with the GPU stages every ``dali`` loader has (nvJPEG
    decode, a GPU resize and normalisation): what fails here would fail the user's first batch."""
    import io

    import numpy as np
    from nvidia.dali import fn, pipeline_def, types
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 120, 150)).save(buffer, "JPEG")
    encoded = np.frombuffer(buffer.getvalue(), dtype=np.uint8)

    @pipeline_def(batch_size=1, num_threads=1, device_id=device_id, prefetch_queue_depth=1, exec_dynamic=True)
    def graph():
        images = fn.decoders.image(fn.external_source(name="encoded", dtype=types.UINT8), device="mixed",
                                   output_type=types.RGB)
        images = fn.resize(images, size=[8, 8], device="gpu")
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", device="gpu")

    pipe = graph()
    pipe.build()
    (out,) = pipe.run(encoded=[encoded])
    out.as_cpu()  # waits for the GPU work: a kernel the driver cannot run fails here


# Failures of the tiny pipeline that may pass while the process lives: the device's memory taken
# by another process, the device busy. They are reported, not remembered.
TRANSIENT_GPU_FAILURES = ("out of memory", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY",
                          "cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE", "busy or unavailable")

_GPU_PIPELINE_ANSWERS: dict[tuple[int, int], str | None] = {}  # (process, device): a forked child asks again


def probe_device() -> int:
    """The CUDA device the tiny pipeline runs on: this rank's own, as its loader's (the local rank
    on the visible devices), so the ranks of a node do not each put a context and decoder pools
    on GPU 0."""
    from ..backends.base import resolve_topology
    from ..backends.device import cuda_ordinal, visible_cuda_devices

    try:
        local_rank = resolve_topology().local_rank
    except ValueError:  # a malformed RANK/WORLD_SIZE: the loader refuses it with its own message
        local_rank = 0
    return cuda_ordinal(local_rank, max(visible_cuda_devices(), 1))


def gpu_pipeline_reason(dali_version: str, device_id: int | None = None) -> str | None:
    """None when a tiny GPU pipeline builds and runs on ``device_id`` (default: this rank's GPU),
    else why not (DALI build and driver named). A lasting answer is kept for the life of the
    process; a failure that may pass (out of memory, a busy device) is logged and asked again."""
    from ..backends.dali.executor import dali_message

    device_id = probe_device() if device_id is None else device_id
    key = (os.getpid(), device_id)
    if key in _GPU_PIPELINE_ANSWERS:
        return _GPU_PIPELINE_ANSWERS[key]
    try:
        _build_tiny_gpu_pipeline(device_id)
    except Exception as exc:
        detail = dali_message(exc)
        reason = (f"DALI {dali_version} ({dali_build()}) cannot run a GPU pipeline with this driver "
                  f"({cuda_driver()}) on cuda:{device_id}: {detail}")
        if any(marker.lower() in str(exc).lower() for marker in TRANSIENT_GPU_FAILURES):
            reason += " (this may pass: not remembered, probed again when next asked)"
            log.warning("%s", reason)
            return reason
        _GPU_PIPELINE_ANSWERS[key] = reason
        return reason
    _GPU_PIPELINE_ANSWERS[key] = None
    return None


gpu_pipeline_reason.cache_clear = _GPU_PIPELINE_ANSWERS.clear  # type: ignore[attr-defined]  # as lru_cache's
probe.cache_clear = _PROBES.clear  # type: ignore[attr-defined]  # as lru_cache's


def unavailable_reason(backend: str, host: Probe | None = None) -> str | None:
    """Why ``backend`` cannot run here, or None when it can."""
    host = host or probe()
    if backend == "dali":
        reason = host.dali_reason or host.cuda_reason or host.dali_gpu_reason
        if reason is None and host.check_gpu_pipeline and host.dali_version:
            reason = gpu_pipeline_reason(host.dali_version)
        return reason
    if backend == "dali-cpu":
        return host.dali_reason
    if backend == "torchvision":
        return host.torchvision_reason
    raise BackendUnavailable(f"unknown backend {backend!r} (expected auto, {', '.join(BACKEND_NAMES)})")


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


def choose_backend(requested: str = "auto", host: Probe | None = None, *, executor: str = "processes") -> Choice:
    """Resolve ``requested`` to a backend that can run here.

    ``auto`` picks ``dali`` when DALI imports and a CUDA device is usable, otherwise
    ``torchvision``; under ``executor="ray"`` (the spec's ``loader.executor``) always ``torchvision``,
    whose per-sample work the cluster runs. An explicit backend that cannot run raises
    :class:`BackendUnavailable` with the reason instead of falling back.
    """
    if executor == "ray":
        return _ray_choice(requested)
    if requested != "auto":
        # An explicit torchvision needs no DALI probe, nor DALI's import (a quarter of a second).
        reason = (torchvision_reason() if requested == "torchvision" and host is None
                  else unavailable_reason(requested, host or probe()))
        if reason:
            raise BackendUnavailable(f"backend '{requested}' cannot run here: {reason}")
        return Choice(requested, f"backend '{requested}' requested explicitly")
    host = host or _host_for_auto()
    dali_reason = unavailable_reason("dali", host)
    if dali_reason is None:
        return Choice("dali", f"auto: DALI {host.dali_version} and {host.cuda_devices} CUDA device(s) found")
    tv_reason = unavailable_reason("torchvision", host)
    if tv_reason:
        raise BackendUnavailable(f"auto: no backend can run here: dali: {dali_reason}; torchvision: {tv_reason}")
    return Choice("torchvision", f"auto: torchvision fallback ({dali_reason})")


def _ray_choice(requested: str) -> Choice:
    """``loader.executor: ray``: the torchvision backend (its per-sample core runs in Ray tasks), Ray installed."""
    from ..backends.ray_executor import ray_missing_reason

    if requested not in ("auto", "torchvision"):
        raise BackendUnavailable(f"backend '{requested}' cannot run with loader.executor: ray, which runs the "
                                 f"torchvision backend's per-sample work on a Ray cluster: set backend: torchvision "
                                 f"(or auto), or another loader.executor")
    reason = torchvision_reason() or ray_missing_reason()
    if reason:
        raise BackendUnavailable(f"loader.executor: ray cannot run here: {reason}")
    return Choice("torchvision", f"loader.executor: ray runs the torchvision backend's per-sample work on a Ray "
                                 f"cluster ({'requested explicitly' if requested == 'torchvision' else 'auto'})")


def _host_for_auto() -> Probe:
    """What ``auto`` needs to know of this host: :func:`probe`'s answer, except on a host where
    torch sees no CUDA device and nothing probed yet. There ``dali`` cannot be picked, so DALI is
    only looked up (disabled, not installed, or there), not imported: its import costs a CPU-only
    loader a quarter of a second. Where it is installed, the reason ``auto`` gives is the CUDA one
    (a DALI install that fails to import is said by ``doctor`` and ``show``, which probe it all)."""
    if _probe_key() in _PROBES:
        return probe()
    devices, cuda_reason = torch_cuda_devices()
    if devices:
        return probe()
    if "dali" in _disabled():
        dali_reason: str | None = _DALI_DISABLED
    else:
        try:
            dali_reason = None if importlib.util.find_spec("nvidia.dali") is not None else dali_missing_reason(0)
        except (ImportError, ValueError):  # no nvidia namespace at all
            dali_reason = dali_missing_reason(0)
    return Probe(None, dali_reason, 0, cuda_reason, torchvision_reason())


def available_backends(host: Probe | None = None) -> list[str]:
    """Every backend that can run on this host, in preference order."""
    host = host or probe()
    return [name for name in BACKEND_NAMES if unavailable_reason(name, host) is None]


def check_device(device: str | torch.device | None) -> torch.device | None:
    """The ``device`` argument as a torch.device, refused here (not deep in an executor) when it names
    a CUDA device this host does not have."""
    import torch

    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device (expected e.g. 'cuda', 'cuda:0' or 'cpu'): "
                         f"{exc}") from None
    if resolved.type != "cuda":
        return resolved
    host = probe()
    if not host.cuda_devices:
        raise BackendUnavailable(f"device {str(device)!r} cannot be used here: {host.cuda_reason or 'no CUDA device'}; "
                                 f"leave device unset (batches then land on the CPU) or run on a host with CUDA")
    if resolved.index is not None and resolved.index >= host.cuda_devices:
        raise BackendUnavailable(f"device {str(device)!r} cannot be used here: this host has {host.cuda_devices} "
                                 f"CUDA device(s), cuda:0 to cuda:{host.cuda_devices - 1}")
    return resolved


def build_executor(backend: str, spec: PipelineSpec, listing: Listing, plan: Plan, *, topology: Topology,
                   device: torch.device | None) -> Executor:
    """The executor of ``backend`` (as :func:`choose_backend` resolved it) for this plan and listing.
    Without a ``device``, torchvision's batches land on the local rank's GPU when the host has one
    (the host facts ``auto`` and ``show`` use, ``DALI_BRIDGE_DISABLE=cuda`` included), else on the CPU."""
    if backend in ("dali", "dali-cpu"):
        from ..backends.dali.executor import DaliExecutor
        return DaliExecutor(spec, listing, plan, gpu=backend == "dali", topology=topology, device=device)
    import torch

    from ..backends.device import cuda_ordinal
    from ..backends.torchvision import TorchvisionExecutor
    if device is None:
        devices, _ = torch_cuda_devices()
        device = torch.device("cuda", cuda_ordinal(topology.local_rank, devices)) if devices else torch.device("cpu")
    if spec.loader.executor == "ray":
        from ..backends.ray_executor import RayExecutor
        return RayExecutor(spec, listing, plan, topology=topology, device=device)
    return TorchvisionExecutor(spec, listing, plan, topology=topology, device=device)
