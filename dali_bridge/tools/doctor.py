"""``dali-bridge doctor``: the facts about this host that decide which backend runs and how fast."""
from __future__ import annotations

import os
import platform
import sys
from typing import Any

from ..backends.base import available_cores, default_workers, worker_share
from ..backends.device import (DECODER_DEVICE_MEMORY_PADDING, DECODER_HOST_MEMORY_PADDING, HW_DECODER_LOAD,
    dali_threads, describe_gpu_threads)
from ..loader.select import BACKEND_NAMES, Probe, choose_backend, dali_extra, probe, unavailable_reason


def _nvjpeg_hardware(dali_ok: bool, cuda_devices: int) -> str:
    if not (dali_ok and cuda_devices):
        return "n/a (needs DALI and a CUDA device)"
    try:
        import torch
        major, minor = torch.cuda.get_device_capability(0)
        name = torch.cuda.get_device_name(0)
    except Exception as exc:
        return f"unknown ({exc})"
    # The nvJPEG hardware decoder (A100, H100/H200, some Blackwell parts) is used by DALI's mixed
    # decoder when present; DALI exposes no query for it, so this reports the GPU generation.
    hw = (major, minor) in ((8, 0), (9, 0), (10, 0))
    return f"{'likely' if hw else 'unlikely'} on {name} (compute capability {major}.{minor})"


def _torch_cuda_build() -> str | None:
    try:
        import torch
        return torch.version.cuda
    except Exception:
        return None


def installed_dali_builds() -> list[str]:
    """Installed DALI distributions (``nvidia-dali-cuda120`` ...), whether or not they import."""
    from importlib.metadata import distributions

    return sorted({d.metadata["Name"].lower() for d in distributions()
                   if (d.metadata["Name"] or "").lower().startswith("nvidia-dali-cuda")})


# The oldest driver branch each CUDA major runs on (NVIDIA's CUDA compatibility guide, "minor version
# compatibility": CUDA 12.x >= 525, CUDA 13.x >= 580; DALI's install guide names the same floors for
# its cuda120 and cuda130 builds). A newer driver runs every older major (backward compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
TORCH_CUDA_12_WHEELS = "https://pytorch.org/get-started/locally/"  # where PyTorch lists its cu12x wheel indexes


def driver_release_version(path: str | os.PathLike = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel driver's release (``580.65.06``) from ``path``; None without one. Read apart
    from torch: a torch whose CUDA is newer than the driver cannot ask it."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    words = [w for w in text.split() if w[:1].isdigit() and w.count(".") >= 1]
    return words[0] if words else None


def _driver_major(driver_cuda: str | None, driver_release: str | None) -> int | None:
    """The newest CUDA major this host's driver runs; None when there is no driver to ask."""
    if driver_cuda and str(driver_cuda).isdigit():
        return int(driver_cuda) // 1000
    branch = driver_release.split(".")[0] if driver_release else ""
    if branch.isdigit():
        return max((major for major, floor in MIN_DRIVER.items() if int(branch) >= floor), default=0)
    return None


def _driver_text(driver_cuda: str | None, driver_release: str | None) -> str:
    """``this driver (550.54.15, CUDA 12.4)``, with what is known of it."""
    parts = [driver_release] if driver_release else []
    if driver_cuda and str(driver_cuda).isdigit():
        parts.append(f"CUDA {int(driver_cuda) // 1000}.{int(driver_cuda) % 1000 // 10}")
    return f"this driver ({', '.join(parts)})"


def cuda_builds_pairing(*, torch_cuda: str | None, dali_builds: list[str], driver_cuda: str | None = None,
                        driver_release: str | None = None) -> str:
    """Whether torch's CUDA build and DALI's pair (the same CUDA major), when it matters, and what to run.

    ``torch_cuda``: ``torch.version.cuda`` ("13.0", None for a CPU build); ``dali_builds``: the
    installed ``nvidia-dali-cudaXY0`` distributions; ``driver_cuda``: the driver's CUDA version as
    CUDA encodes it (12040 = 12.4), when a device was found; ``driver_release``: the kernel
    driver's release (``580.65.06``), when one is loaded. Neither: a host without an NVIDIA driver.
    """
    torch_major = int(torch_cuda.split(".")[0]) if torch_cuda else None
    wanted = f"nvidia-dali-cuda{torch_major}0" if torch_major else "nvidia-dali-cuda130"
    if len(dali_builds) > 1:
        return (f"no: {len(dali_builds)} DALI builds are installed ({', '.join(dali_builds)}) and they write the "
                f"same files; pip uninstall -y {' '.join(dali_builds)} && pip install {wanted}")
    if not dali_builds:
        return (f"no DALI installed (the dali and dali-cpu backends need it): "
                f"pip install 'dali-bridge[{_extra_for_host(torch_major, driver_cuda, driver_release)}]'")
    dali_major = int(dali_builds[0].removeprefix("nvidia-dali-cuda")[:-1] or 0)
    if torch_major is None:
        return (f"torch is a CPU build: dali-cpu and torchvision run, the GPU backend cannot hand its batches "
                f"to torch; for it, install torch built for CUDA {dali_major} (the cu{dali_major}x wheels)")
    if torch_major != dali_major:
        return _mixed_pair(torch_cuda, torch_major, dali_builds[0], dali_major, driver_cuda, driver_release)
    driver = ""
    supported = _driver_major(driver_cuda, driver_release)
    if supported is not None and supported < torch_major:
        driver = (f"; {_driver_text(driver_cuda, driver_release)} is too old for a CUDA {torch_major} build: update "
                  f"the driver (>= {MIN_DRIVER.get(torch_major, '?')}) or use builds for CUDA {supported}")
    return f"yes: torch and DALI ({dali_builds[0]}) are both CUDA {torch_major} builds{driver}"


def _extra_for_host(torch_major: int | None, driver_cuda: str | None, driver_release: str | None) -> str:
    """The dali-bridge extra for this host: DALI built for torch's CUDA major, unless the driver runs
    only an older one (then the driver's: DALI runs, and the pairing line says what torch needs)."""
    supported = _driver_major(driver_cuda, driver_release)
    if torch_major is not None and supported and supported < torch_major:
        return dali_extra(supported)
    return dali_extra(torch_major if torch_major is not None else supported)


def _mixed_pair(torch_cuda: str, torch_major: int, dali_build: str, dali_major: int, driver_cuda: str | None,
                driver_release: str | None) -> str:
    """torch and DALI built for different CUDA majors: harmless without a GPU; on one, both runtimes need the driver."""
    newest = max(torch_major, dali_major)
    pair = f"torch is built for CUDA {torch_cuda} and DALI for CUDA {dali_major} ({dali_build})"
    floors = (f"on a GPU host each process loads both CUDA runtimes side by side and each needs the driver: "
              f"CUDA {torch_major} (torch) a driver >= {MIN_DRIVER.get(torch_major, '?')}, CUDA {dali_major} (DALI) "
              f">= {MIN_DRIVER.get(dali_major, '?')}")
    pair_them = f"pip uninstall -y {dali_build} && pip install nvidia-dali-cuda{torch_major}0"
    supported = _driver_major(driver_cuda, driver_release)
    if supported is None:
        return (f"fine on this host: {pair}, and without an NVIDIA driver here dali-cpu and torchvision use "
                f"neither; {floors}, so a driver >= {MIN_DRIVER.get(newest, '?')} runs both; to load one runtime: "
                f"{pair_them}")
    driver = _driver_text(driver_cuda, driver_release)
    torch_runs, dali_runs = supported >= torch_major, supported >= dali_major
    if torch_runs and dali_runs:
        return (f"works here: {pair}; {driver} runs both (>= {MIN_DRIVER.get(newest, '?')}), each process loading "
                f"both CUDA runtimes side by side; to load one: {pair_them}")
    if dali_runs:
        return (f"breaks here: {pair}; {driver} is older than CUDA {torch_major} needs "
                f"(>= {MIN_DRIVER.get(torch_major, '?')}): DALI runs but torch cannot use the GPU, so the dali backend "
                f"cannot run; update the driver to >= {MIN_DRIVER.get(torch_major, '?')} and {pair_them}, or keep "
                f"this driver and install torch built for CUDA {dali_major} (its cu{dali_major}x wheels: "
                f"{TORCH_CUDA_12_WHEELS})")
    if torch_runs:
        return (f"breaks here: {pair}; {driver} is older than CUDA {dali_major} needs "
                f"(>= {MIN_DRIVER.get(dali_major, '?')}): torch runs but DALI cannot use the GPU; {pair_them}")
    return (f"breaks here: {pair}; {driver} runs neither (CUDA {torch_major} needs >= "
            f"{MIN_DRIVER.get(torch_major, '?')}, CUDA {dali_major} >= {MIN_DRIVER.get(dali_major, '?')}): update "
            f"the driver to >= {MIN_DRIVER.get(newest, '?')}")


def _add_libraries(info: dict[str, Any], host: Probe) -> None:
    """torch (and its CUDA build), torchvision and DALI (and its builds): versions, or why they are missing."""
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_cuda_build"] = torch.version.cuda or "none (CPU build)"
    except Exception as exc:
        info["torch"] = f"unavailable: {exc}"
    try:
        import torchvision
        info["torchvision"] = torchvision.__version__
    except Exception as exc:
        info["torchvision"] = f"unavailable: {exc}"
    info["dali"] = host.dali_version or host.dali_reason
    if host.dali_version:
        try:
            from importlib.metadata import distributions
            builds = sorted(d.metadata["Name"] for d in distributions()
                            if (d.metadata["Name"] or "").lower().startswith("nvidia-dali"))
            info["dali_build"] = ", ".join(builds) or "unknown"
        except Exception:
            info["dali_build"] = "unknown"


def _add_cuda_devices(info: dict[str, Any], host: Probe) -> None:
    """The CUDA devices (name, memory, compute capability) and the driver's CUDA version."""
    devices = []
    if host.cuda_devices:
        import torch
        for n in range(host.cuda_devices):
            props = torch.cuda.get_device_properties(n)
            devices.append(f"cuda:{n} {props.name} ({props.total_memory / 2**30:.0f} GiB, "
                           f"cc {props.major}.{props.minor})")
        try:
            info["cuda_driver"] = str(torch._C._cuda_getDriverVersion())
        except Exception:
            pass
    info["cuda_devices"] = devices or [host.cuda_reason or "none"]


def report() -> dict[str, Any]:
    """The environment as data (printed by ``doctor``, tested without a GPU)."""
    host = probe()
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_cores_available": available_cores(),
        "cpu_cores_total": os.cpu_count(),
        "workers_auto": worker_share().explain(),
    }
    _add_libraries(info, host)
    _add_cuda_devices(info, host)
    release = driver_release_version()
    if release:
        info["nvidia_driver"] = release
    info["cuda_builds"] = cuda_builds_pairing(torch_cuda=_torch_cuda_build(), dali_builds=installed_dali_builds(),
                                              driver_cuda=info.get("cuda_driver"), driver_release=release)
    from ..ops.registry import ORIGINS
    info["ops_from_packages"] = [f"{name}: {origin}" for name, origin in sorted(ORIGINS.items())] or ["none"]
    info["nvjpeg_hardware_decoder"] = _nvjpeg_hardware(host.dali_version is not None, host.cuda_devices)
    info["backends"] = {name: unavailable_reason(name, host) or "available" for name in BACKEND_NAMES}
    try:
        choice = choose_backend("auto", host)
        info["auto_picks"] = f"{choice.backend} — {choice.reason}"
    except Exception as exc:
        info["auto_picks"] = f"nothing: {exc}"
    cores = default_workers()
    info["recommended"] = {
        "loader.workers (torchvision processes)": cores,
        "loader.workers (DALI threads)": dali_threads(None, gpu=bool(host.cuda_devices), auto_cores=cores),
        "loader.prefetch": 2,
    }
    info["dali_gpu_defaults"] = gpu_defaults(host)
    return info


def gpu_defaults(host: Probe) -> dict[str, Any]:
    """What a ``dali`` loader takes on this host under ``workers: auto``, and what it costs in memory."""
    threads = dali_threads(None, gpu=True, auto_cores=default_workers())
    per_thread = DECODER_DEVICE_MEMORY_PADDING, DECODER_HOST_MEMORY_PADDING
    return {
        "DALI threads per process": describe_gpu_threads(),
        # DALI's docs: one device buffer and two pinned host buffers (double-buffering) per thread.
        "decoder memory padding": f"{per_thread[0] * threads / 2**20:.0f} MiB GPU + "
                                  f"{2 * per_thread[1] * threads / 2**20:.0f} MiB pinned host per process ({threads} "
                                  f"threads x ({per_thread[0] / 2**20:.0f} + 2 x {per_thread[1] / 2**20:.0f} MiB))",
        "nvJPEG hardware decoder share": f"{HW_DECODER_LOAD} (parity: exact too; to be measured on a GPU)",
        "GPU pipeline": ("n/a (needs DALI and a CUDA device)" if not (host.dali_version and host.cuda_devices)
                         else unavailable_reason("dali", host) or "a tiny one built and ran"),
    }


def format_report(info: dict[str, Any]) -> str:
    lines = []
    for key, value in info.items():
        label = key.replace("_", " ")
        if isinstance(value, dict):
            lines.append(f"{label}:")
            lines += [f"  {k:<40} {v}" for k, v in value.items()]
        elif isinstance(value, list):
            lines.append(f"{label}:")
            lines += [f"  {v}" for v in value]
        else:
            lines.append(f"{label:<26} {value}")
    return "\n".join(lines)
