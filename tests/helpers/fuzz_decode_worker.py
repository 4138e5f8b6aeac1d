"""Decode mutated images in this (expendable) process: run by ``tests/hostile/test_fuzz_decode.py`` in a
subprocess, so that a decoder crash shows as a failed test rather than a dead pytest.

* ``python fuzz_decode_worker.py decoders COUNT SEED REPORT``: each of ``COUNT`` mutated images
  (:func:`hostile.mutated_images`) through the check and both decoders, one by one. Before each file
  the worker writes its number to ``REPORT.current``; at the end it writes ``REPORT`` (JSON): per
  file the format, mutation, the check's verdict and each decoder's outcome.
* ``python fuzz_decode_worker.py loader PIPELINE BACKEND REPORT``: one epoch of the pipeline (JSON
  file) on the backend; ``REPORT`` (``.npz``) holds the yielded indices, their images, the
  skipped indices with their reasons, and how much the process's peak memory grew from before
  building the loader to the end of the epoch (``getrusage``'s ``ru_maxrss``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO)]  # the tests' helpers and the dali_bridge beside them

from tests.helpers.hostile import mutated_images, tiny_jpeg  # noqa: E402 (after the path set-up above)

from dali_bridge.data.sources.formats import inspect_image, without_webp_exif  # noqa: E402
from dali_bridge.errors import ImageError  # noqa: E402
from dali_bridge.data.sources.images import decode_rgb  # noqa: E402


class DaliDecoder:
    """DALI's CPU image decoder on one encoded image at a time (a new pipeline after each failure)."""

    def __init__(self) -> None:
        self.pipe = None

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_async=False, exec_pipelined=False,
                      prefetch_queue_depth=1)
        def graph():
            return fn.decoders.image(fn.external_source(name="encoded", dtype=types.UINT8), device="cpu",
                                     output_type=types.RGB)

        pipe = graph()
        pipe.build()
        return pipe

    def decode(self, data: bytes) -> np.ndarray | None:
        """HWC uint8 pixels, or None when DALI refuses the bytes."""
        if self.pipe is None:
            self.pipe = self._build()
        try:
            self.pipe.feed_input("encoded", [np.frombuffer(data, dtype=np.uint8)])
            return np.array(self.pipe.run()[0][0])
        except Exception:  # noqa: BLE001 — DALI raises several kinds of error for an undecodable input
            self.pipe = None
            return None


def outcome(data: bytes, dali: DaliDecoder) -> dict:
    """The check's verdict, then, if it passes, both decoders' outcomes (shape or None) and their
    largest pixel difference."""
    try:
        info = inspect_image(data)
    except ImageError as exc:
        return {"check": str(exc)}
    result: dict = {"check": "ok"}
    try:
        torchvision = decode_rgb(data).permute(1, 2, 0).numpy()
    except ImageError:
        torchvision = None
    pixels = dali.decode(without_webp_exif(data) if info.format == "webp" else data)
    result["torchvision"] = None if torchvision is None else list(torchvision.shape)
    result["dali"] = None if pixels is None else list(pixels.shape)
    if torchvision is not None and pixels is not None and torchvision.shape == pixels.shape:
        result["max_difference"] = int(np.abs(torchvision.astype(np.int16) - pixels).max())
    return result


def main(count: int, seed: int, report: Path) -> None:
    dali = DaliDecoder()
    results = []
    current = report.with_suffix(".current")
    for number, (format, mutation, data) in enumerate(mutated_images(count, seed)):
        current.write_text(f"{number} {format} {mutation}")
        results.append({"number": number, "format": format, "mutation": mutation,
                        **outcome(data, dali)})
    report.write_text(json.dumps(results))


def run_loader(pipeline: Path, backend: str, report: Path) -> None:
    import resource

    from dali_bridge import build_loader

    # The backends' libraries loaded (and the reference decoder run once) before the first
    # peak-memory reading: it measures the epoch.
    from dali_bridge.backends import torchvision  # noqa: F401

    decode_rgb(tiny_jpeg(0))
    if backend.startswith("dali"):
        from nvidia.dali import fn, pipeline_def  # noqa: F401

        from dali_bridge.backends.dali import executor as dali  # noqa: F401

    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    loader = build_loader(json.loads(pipeline.read_text()), backend)
    indices, images = [], []
    for image, index in loader:
        indices.extend(index.tolist())
        images.extend(image.numpy())
    skipped = [(item.index, item.reason) for item in loader.skipped]
    loader.close()
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.savez(report, indices=np.array(indices, dtype=np.int64), images=np.array(images, dtype=np.uint8),
             skipped_indices=np.array([i for i, _ in skipped], dtype=np.int64),
             skipped_reasons=np.array([r for _, r in skipped], dtype=str),
             peak_growth_bytes=np.int64((peak_after - peak_before) * 1024))


if __name__ == "__main__":
    if sys.argv[1] == "decoders":
        main(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        run_loader(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
