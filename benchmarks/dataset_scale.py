"""What a dataset's size costs the loader: synthetic datasets of 10^4, 10^5 and 10^6 samples, as an
image folder and as WebDataset shards, and for each, in a fresh process:

* **listing**: seconds to list the source (the folder walked, or every shard's index read and
  checked), the bytes of the index the listing holds (its sample names, labels and shard
  locations, walked object by object) and how much the process's private memory grew;
* **workers**: two DataLoader workers forked from the process that holds the listing each look
  every sample's name and label up, as an epoch's reads do, and let the garbage collector run; the
  private memory each gained is the part of the index it copied (Python objects are copied page by
  page as their reference counts are written; arrays stay shared);
* **ready**: ``build_loader`` (which lists the source again; torch and torchvision are imported
  before, as a training script has them, and their import time is recorded apart) and the first batch of
  ``imagenet_train``'s operations on the ``torchvision`` backend with two worker processes, and
  those workers' memory then (``/proc/<pid>/smaps_rollup``: RSS, PSS, USS);
* **state dict**: the seconds of the first ``state_dict()`` (its dataset fingerprint is a pass over
  every sample's name) and its size pickled and ``torch.save``'d.

The folder is ImageNet's layout (1,000 class folders, ``n00000042/n00000042_1234.JPEG``) of hard
links to a few real photos (scikit-image's, saved as JPEG; data/sample's first images where
scikit-image is missing): a million files cost a million directory entries, not a million images.
The shards are written as ``dali-bridge convert`` writes them (1,000 samples per shard, a DALI
index beside each, a manifest with the labels) holding 32×32 versions of the same photos, so 10^6
samples are about 2.5 GB; one set of 10^6 serves every count (a brace pattern over its first
shards). The page cache holds what was just written: listing times are warm ones.

Goals: 10^6 files listed and the first batch out within 10 s; the index at most 64 bytes per
sample and not copied by the workers; the state dict's size independent of the dataset.

    .venv/bin/python benchmarks/dataset_scale.py                     # about 5 minutes; writes the JSON below
    .venv/bin/python benchmarks/dataset_scale.py --counts 1000,10000 --out /tmp/scale.json   # a quick run

It writes one results file (``--out``, by default ``benchmarks/results/dataset_scale.json``) with
the machine and its load average, which ``python -m dali_bridge.bench readme`` renders. What it
builds goes in ``--work-dir`` (a temporary folder by default), removed at the end unless ``--keep``
(a kept folder is reused by the next run).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dali_bridge.bench.scale_report import SCALE_FORMAT  # noqa: E402

SHARD_SIZE = 1000        # samples per shard: convert's default
CLASSES = 1000           # ImageNet's class count
WORKERS = 2
TINY = 32                # the shards' images, pixels a side
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
MAX_LINKS = 50_000       # links per photo file: ext4 allows 65,000 per inode
CHILD_TIMEOUT_S = 300


def _photos(work: Path) -> tuple[list[bytes], str]:
    """A few real photos as JPEG bytes, and where they came from."""
    from PIL import Image

    try:
        import skimage.data

        images = [Image.fromarray(getattr(skimage.data, name)()) for name in PHOTOS]
        origin = "scikit-image's " + ", ".join(PHOTOS)
    except ImportError:
        files = sorted((REPO / "data" / "sample").rglob("*.jpg"))[:len(PHOTOS)]
        if not files:
            raise SystemExit("needs scikit-image (the test extra) or data/sample (./dev.sh run)") from None
        images = [Image.open(f) for f in files]
        origin = f"{len(files)} of data/sample's generated images (scikit-image is not installed)"
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded, origin


def _tiny(photos: list[bytes]) -> list[bytes]:
    from PIL import Image

    tiny = []
    for data in photos:
        buffer = io.BytesIO()
        Image.open(io.BytesIO(data)).resize((TINY, TINY)).save(buffer, format="JPEG", quality=85, optimize=True)
        tiny.append(buffer.getvalue())
    return tiny


def _class_of(sample: int, samples: int) -> int:
    """Samples spread over the classes in order, as a sorted ImageFolder lists them."""
    return sample * min(CLASSES, samples) // samples


def build_folder(root: Path, samples: int, photos: list[bytes]) -> float:
    """An ImageFolder of ``samples`` hard links to the photos; seconds it took (0 when a kept one is reused)."""
    done = root / ".complete"
    if done.is_file():
        return 0.0
    started = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    sources_dir = root.parent / f"{root.name}.photos"
    sources_dir.mkdir(parents=True, exist_ok=True)
    copies = max(len(photos), -(-samples // MAX_LINKS))
    sources = []
    for number in range(copies):
        path = sources_dir / f"photo_{number}.jpg"
        path.write_bytes(photos[number % len(photos)])
        sources.append(str(path))
    current = -1
    folder = ""
    for sample in range(samples):
        label = _class_of(sample, samples)
        if label != current:
            current, folder = label, str(root / f"n{label:08d}")
            os.makedirs(folder)
        os.link(sources[sample % copies], f"{folder}/n{label:08d}_{sample}.JPEG")
    done.write_text(str(samples))
    return time.perf_counter() - started


def _ustar_header(name: bytes, size: int) -> bytes:
    """A ustar header block as tarfile writes one for a regular file (mode 644, owner 0, mtime 0)."""
    head = name.ljust(100, b"\0") + b"0000644\0" + b"0000000\0" + b"0000000\0" + b"%011o\0" % size + b"%011o\0" % 0
    tail = b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * 64 + b"0000000\0" * 2 + b"\0" * 167
    checksum = sum(head) + sum(tail) + 8 * ord(" ")
    return head + b"%06o\0 " % checksum + tail


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def build_shards(folder: Path, samples: int, tiny: list[bytes]) -> float:
    """``samples`` samples in shards of :data:`SHARD_SIZE` with their DALI indexes and a manifest, as
    ``dali-bridge convert`` writes them; seconds it took (0 when a kept set is reused)."""
    done = folder / ".complete"
    if done.is_file() and int(done.read_text()) >= samples:
        return 0.0
    started = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    entries = []
    for shard in range(-(-samples // SHARD_SIZE)):
        chunks, lines, labels, position = [], [], [], 0
        for sample in range(shard * SHARD_SIZE, min(samples, (shard + 1) * SHARD_SIZE)):
            label = _class_of(sample, samples)
            key = f"n{label:08d}/n{label:08d}_{sample}"
            fields = []
            for ext, payload in (("cls", str(label).encode()), ("jpg", tiny[sample % len(tiny)])):
                name = f"{key}.{ext}"
                chunks += [_ustar_header(name.encode(), len(payload)), _padded(payload)]
                fields.append(f"{ext} {position + 512} {len(payload)} {name}")
                position += 512 + len(_padded(payload))
            lines.append(" ".join(fields))
            labels.append(label)
        chunks.append(b"\0" * (-(position + 1024) % 10240 + 1024))   # end-of-archive blocks, record padding
        tar = folder / f"train-{shard:06d}.tar"
        tar.write_bytes(b"".join(chunks))
        index = f"v1.2 {len(lines)}\n".encode() + "\n".join(lines).encode() + b"\n"
        (folder / f"train-{shard:06d}.idx").write_bytes(index)
        entries.append({"file": tar.name, "index_file": f"train-{shard:06d}.idx", "samples": len(lines),
                        "bytes": tar.stat().st_size, "index_sha256": hashlib.sha256(index).hexdigest(),
                        "labels": " ".join(map(str, labels)), "first_sample": shard * SHARD_SIZE})
    classes = [f"n{label:08d}" for label in range(min(CLASSES, samples))]
    manifest = {"format": "dali-bridge-shards", "version": 1, "samples": samples, "shard_size": SHARD_SIZE,
                "shards_pattern": "train-%06d.tar", "label_key": "cls", "classes": classes, "shards": entries}
    (folder / "train.manifest.json").write_text(json.dumps(manifest, indent=2))
    done.write_text(str(samples))
    return time.perf_counter() - started


def _pipeline(work: Path, kind: str, samples: int, shards_samples: int) -> Path:
    """The measured pipeline: imagenet_train's operations on this source, two worker processes."""
    if kind == "folder":
        source = f"  type: folder\n  root: {work / f'folder-{samples}'}\n"
    else:
        last = -(-samples // SHARD_SIZE) - 1
        # a subset of the one shard set: its classes (the manifest's) are those of the full set
        source = f"  type: webdataset\n  shards: {work / 'shards'}/train-{{000000..{last:06d}}}.tar\n"
    path = work / f"{kind}-{samples}.yaml"
    path.write_text(f"""version: 1
name: dataset-scale-{kind}-{samples}
source:
{source}batch_size: 64
seed: 0
ops:
  - random_resized_crop: {{size: 224}}
  - horizontal_flip: {{probability: 0.5}}
  - normalize: {{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
loader:
  workers: {WORKERS}
  shuffle: true
""")
    return path


def measure(pipeline: str) -> dict[str, Any]:
    """One source's figures, in this (fresh) process: see the module's description."""
    started = time.perf_counter()
    import torch
    import torchvision  # noqa: F401  (build_loader's backend check imports it: seconds, once per process)

    from dali_bridge import build_loader, load_spec
    from dali_bridge.backends import torchvision as executor  # noqa: F401
    imports_s = time.perf_counter() - started
    from dali_bridge.bench.procstats import process_tree
    from dali_bridge.bench.scale import index_bytes, index_copied_by_workers, memory_rollup
    from dali_bridge.data.sources.local import list_source

    spec = load_spec(pipeline)
    gc.collect()
    before = memory_rollup()
    started = time.perf_counter()
    listing = list_source(spec.source)
    list_s = time.perf_counter() - started
    gc.collect()
    after = memory_rollup()
    row: dict[str, Any] = {"imports_s": round(imports_s, 3), "samples": len(listing), "list_s": round(list_s, 3),
                           "index_bytes": index_bytes(listing), "listing_private_growth": after["uss"] - before["uss"]}
    row["workers_index_copy"] = [{"private_growth": w["private_growth"], "uss_before": w["before"]["uss"],
                                  "uss_after": w["after"]["uss"], "pss_after": w["after"]["pss"]}
                                 for w in index_copied_by_workers(listing, WORKERS)]
    del listing
    gc.collect()
    started = time.perf_counter()
    loader = build_loader(pipeline, "torchvision", device="cpu")
    row["build_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    batches = iter(loader)
    next(batches)
    row["first_batch_s"] = round(time.perf_counter() - started, 3)
    row["ready_s"] = round(row["build_s"] + row["first_batch_s"], 3)
    row["main_memory"] = memory_rollup()
    row["loader_workers_memory"] = [memory_rollup(pid) for pid in process_tree(os.getpid())[1:]]
    started = time.perf_counter()
    state = loader.state_dict()
    row["state_dict_s"] = round(time.perf_counter() - started, 3)
    saved = io.BytesIO()
    torch.save(state, saved)
    row["state_dict"] = state
    row["state_dict_pickle_bytes"] = len(pickle.dumps(state))
    row["state_dict_torch_save_bytes"] = len(saved.getvalue())
    loader.close()
    return row


def _measured(pipeline: Path) -> dict[str, Any]:
    """:func:`measure` in a process of its own (a clean heap, the loader's workers forked from it)."""
    done = subprocess.run([sys.executable, __file__, "--measure", str(pipeline)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["(no output)"])[-1][:500]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace, work: Path, record: dict[str, Any]) -> None:
    photos, record["photos"] = _photos(work)
    counts = sorted(args.counts)
    if "webdataset" in args.sources:
        seconds = build_shards(work / "shards", counts[-1], _tiny(photos))
        record["made"].append({"what": f"{counts[-1]:,} samples in shards", "seconds": round(seconds, 1)})
        print(f"shards of {counts[-1]:,} samples: {seconds:.1f} s", flush=True)
    for samples in counts:
        for kind in args.sources:
            if kind == "folder":
                seconds = build_folder(work / f"folder-{samples}", samples, photos)
                record["made"].append({"what": f"a folder of {samples:,} links", "seconds": round(seconds, 1)})
            row = {"source": kind, "count": samples, "load_average_1min": round(os.getloadavg()[0], 2),
                   **_measured(_pipeline(work, kind, samples, counts[-1]))}
            record["runs"].append(row)
            print(f"{kind} {samples:,}: " + (row["error"] if "error" in row else
                  f"listed in {row['list_s']} s, ready in {row['ready_s']} s, "
                  f"{row['index_bytes']['total'] / row['samples']:.1f} B/sample"), flush=True)
            if kind == "folder" and not args.keep:
                shutil.rmtree(work / f"folder-{samples}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10000,100000,1000000",
                        type=lambda text: [int(n) for n in text.split(",")], help="sample counts, comma-separated")
    parser.add_argument("--sources", default="folder,webdataset", type=lambda text: text.split(","),
                        help="folder, webdataset or both (comma-separated)")
    parser.add_argument("--work-dir", help="where the datasets are built (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="leave the datasets in --work-dir (reused next run)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "dataset_scale.json"))
    parser.add_argument("--measure", metavar="PIPELINE", help=argparse.SUPPRESS)   # the child's entry
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    from dali_bridge.bench.results import loadavg, machine_description

    started = time.monotonic()
    print(f"writes {args.out}", flush=True)
    record: dict[str, Any] = {"format": SCALE_FORMAT, "command": " ".join(["benchmarks/dataset_scale.py",
                                                                           *(argv or sys.argv[1:])]),
                              "workers": WORKERS, "shard_size": SHARD_SIZE, "classes": CLASSES,
                              "machine": machine_description(), "made": [], "runs": []}
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="dali-bridge-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work, record)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    record["machine"]["loadavg_at_end"] = loadavg()
    record["run_s"] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out} in {record['run_s']} s" + ("" if not args.keep else f"; the datasets stay in {work}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
