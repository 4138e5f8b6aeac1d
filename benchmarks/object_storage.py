"""Shards in object storage against the same shards on local disk: images/s, first batch, memory,
ranged-read rate and CPU cost per server and client, and listing requests and time.

Starts moto's S3 server on 127.0.0.1 in a process of its own, Python's HTTP server (Range
support) on the same shards, and in front of each the tests' fault proxy adding a fixed latency
to every request (0 and 20 ms by default), converts an image folder to shards, uploads them, and
measures, for each latency (``--parts`` picks among the three):

* **epochs** of a pipeline (``imagenet_train``) per backend and mode, each in a process of its
  own (so its peak RSS is its own; its DataLoader workers start the platform's default way, as a
  training script's do): ``local`` (the shards on local disk, the reference), ``ranged``
  (``s3://`` shards from moto, each sample one ranged GET, a batch's GETs concurrent),
  ``ranged-http`` (the same from the HTTP server: the bridge's ceiling apart from moto's) and
  ``cache`` (``source.cache``, cold at the start of the run): images/s over the epoch, seconds
  from ``iter()`` to the first batch, peak RSS of the process and its workers;
* **ranged reads**: the samples' byte ranges read with ``max_requests`` in flight, with nothing to
  decode, by the bridge's client (URLs s3fs signed, on aiohttp; fsspec HTTP), s3fs's own calls and
  obstore, each in a process of its own, from each server through the proxy and (at 0 ms)
  directly: ranges/s, MiB/s and the CPU seconds per 1,000 GETs of the client, of moto's process
  and of the proxies and HTTP server;
* **listing** ``--listing-shards`` shards (1,024 by default) of one small sample each: a cold
  listing (no listing cache) and a warm one, with the requests each made.

It writes one results file (``--out``, by default ``benchmarks/results/object_storage.json``)
with the machine and the command, which ``python -m dali_bridge.bench readme`` renders. Goals:
at 20 ms without a cache at least 90 % of local images/s, the first batch within 2 s, memory
bounded by ``max_requests`` × sample size.

    .venv/bin/python benchmarks/object_storage.py --data data/sample
    .venv/bin/python benchmarks/object_storage.py --quick --data DIR --out /tmp/object_storage.json  # smoke run
    .venv/bin/python benchmarks/object_storage.py --parts ranged --latency-ms 0 --out /tmp/ranged.json

``--quick`` (one latency, one backend, 16 listing shards, few ranges) only checks that the script
works: its figures say nothing, and the report says so. Needs moto[server] and s3fs (the test
extra; obstore optional: the bench extra). Run it on an otherwise idle machine: figures taken
under load say nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the loopback servers live with the tests (tests.helpers): one copy of them

from tests.helpers.s3_fixtures import LOOPBACK, FaultProxy, free_port, serve_folder, upload_folder  # noqa: E402

from dali_bridge import build_loader  # noqa: E402
from dali_bridge.bench.storage_report import OBJECT_STORAGE_FORMAT  # noqa: E402
from dali_bridge.tools.convert import convert  # noqa: E402
from dali_bridge.data.sources.webdataset import list_webdataset  # noqa: E402
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS  # noqa: E402
from dali_bridge.data.storage.store import ObjectStore, Range  # noqa: E402

BUCKET = "bench-bucket"


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, workers) / 1024   # Linux reports KiB


def _epoch_in_child(pipeline: str, backend: str, overrides: dict[str, Any], queue: Any) -> None:
    # A spawned process inherits "spawn" as its default start method, so its DataLoader workers
    # would be spawned too, each importing this script and torch again before its first batch
    # (seconds): a training script's workers start the platform's default way, as here.
    multiprocessing.set_start_method(None, force=True)
    loader = build_loader(pipeline, backend, overrides=overrides)
    started = time.perf_counter()
    first = None
    images = 0
    for batch in loader:
        images += len(batch[0])
        if first is None:
            first = time.perf_counter() - started
    seconds = time.perf_counter() - started
    loader.close()
    queue.put({"images": images, "seconds": seconds, "images_per_s": images / seconds,
               "first_batch_s": first or 0.0, "peak_rss_mib": _peak_rss_mib()})


def epoch(pipeline: Path, backend: str, overrides: dict[str, Any]) -> dict[str, float]:
    """One epoch in a spawned process of its own: its figures, or why it failed."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_epoch_in_child, args=(str(pipeline), backend, overrides, queue))
    child.start()
    child.join()
    if child.exitcode != 0 or queue.empty():
        return {"error": f"the epoch's process ended with exit code {child.exitcode}"}
    return queue.get()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ranged_reads_bridge(ranges: list[Range], endpoint: str, max_requests: int) -> tuple[float, float]:
    """The bridge's client (fsspec + s3fs for s3://, fsspec's HTTP for http://): (seconds, CPU seconds)."""
    scheme = ranges[0].url.split("://", 1)[0]
    if scheme == "http":
        ranges = [Range(r.url.replace("http://server", endpoint, 1), r.start, r.size) for r in ranges]
    store = ObjectStore(scheme, {"endpoint_url": endpoint} if scheme == "s3" else {}, max_requests=max_requests)
    store.info([ranges[0].url])   # the client and its connections made before the clock starts
    cpu, started = _cpu_seconds(), time.perf_counter()
    answers = store.fetch(ranges)
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    if any(not isinstance(a, bytes) for a in answers):
        raise RuntimeError("a ranged read through the bridge's client failed")
    return seconds, cpu


def ranged_reads_s3fs(ranges: list[Range], endpoint: str, max_requests: int) -> tuple[float, float]:
    """s3fs's own ranged read (``_cat_file``: one aiobotocore ``get_object`` call per range)."""
    import fsspec
    from fsspec.asyn import sync

    fs = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=endpoint)

    async def run() -> tuple[float, float]:
        limit = asyncio.Semaphore(max_requests)

        async def one(request: Range) -> int:
            async with limit:
                return len(await fs._cat_file(request.url, start=request.start, end=request.start + request.size))

        await one(ranges[0])   # the client and its connections made before the clock starts
        cpu, started = _cpu_seconds(), time.perf_counter()
        sizes = await asyncio.gather(*(one(r) for r in ranges))
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
        if sizes != [r.size for r in ranges]:
            raise RuntimeError("a ranged read through s3fs returned other bytes")
        return seconds, cpu

    return sync(fs.loop, run)


def ranged_reads_obstore(ranges: list[Range], endpoint: str, max_requests: int) -> tuple[float, float]:
    from obstore import get_range_async
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", client_options={"allow_http": True},
                    virtual_hosted_style_request=False)
    keys = [r.url.split(f"s3://{BUCKET}/", 1)[1] for r in ranges]

    async def run() -> tuple[float, float]:
        limit = asyncio.Semaphore(max_requests)

        async def one(key: str, request: Range) -> int:
            async with limit:
                data = await get_range_async(store, key, start=request.start, length=request.size)
                return len(data)

        await one(keys[0], ranges[0])   # connections made before the clock starts
        cpu, started = _cpu_seconds(), time.perf_counter()
        sizes = await asyncio.gather(*(one(k, r) for k, r in zip(keys, ranges)))
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
        if sizes != [r.size for r in ranges]:
            raise RuntimeError("a ranged read through obstore returned other bytes")
        return seconds, cpu

    return asyncio.run(run())


CLIENTS = {"the bridge's (s3fs signs, aiohttp GETs)": ("s3", ranged_reads_bridge),
           "s3fs calls (aiobotocore per GET)": ("s3", ranged_reads_s3fs), "obstore": ("s3", ranged_reads_obstore),
           "fsspec HTTP (the bridge's)": ("http", ranged_reads_bridge)}


def _ranged_in_child(client: str, ranges: list[Range], endpoint: str, max_requests: int, queue: Any) -> None:
    try:
        seconds, cpu = CLIENTS[client][1](ranges, endpoint, max_requests)
    except ImportError as exc:
        queue.put({"skipped": f"not installed ({exc.name}): pip install 'dali-bridge[bench]'"})
        return
    queue.put({"seconds": seconds, "cpu_s": cpu})


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ranged_read_rates(ranges: list[Range], targets: dict[str, tuple[str, str]], max_requests: int,
                      latency_ms: float, moto_pid: int) -> list[dict]:
    """Each client on each target (name → (scheme, endpoint)) reading ``ranges`` (``s3://`` URLs; over
    HTTP the same keys under the server), in a process of its own: the loader's CPU is the client's alone,
    never the servers'. Beside it, the CPU seconds moto's process and this one (the proxies and the HTTP
    server) spent meanwhile, per 1,000 GETs: what serving them costs the machine."""
    total = sum(r.size for r in ranges)
    rows = []
    context = multiprocessing.get_context("spawn")
    for target, (scheme, endpoint) in targets.items():
        asked = ranges if scheme == "s3" else [Range(r.url.replace(f"s3://{BUCKET}", "http://server", 1),
                                                     r.start, r.size) for r in ranges]
        for client in (name for name, (client_scheme, _) in CLIENTS.items() if client_scheme == scheme):
            row: dict[str, Any] = {"latency_ms": latency_ms, "target": target, "client": client,
                                   "ranges": len(ranges), "max_requests": max_requests}
            queue = context.Queue()
            child = context.Process(target=_ranged_in_child, args=(client, asked, endpoint, max_requests, queue))
            servers = _process_cpu_seconds(moto_pid), _cpu_seconds()
            child.start()
            child.join()
            moto_cpu, here_cpu = _process_cpu_seconds(moto_pid) - servers[0], _cpu_seconds() - servers[1]
            got = queue.get() if child.exitcode == 0 and not queue.empty() else \
                {"skipped": f"its process ended with exit code {child.exitcode}"}
            if "skipped" in got:
                rows.append({**row, **got})
                continue
            rows.append({**row, "seconds": got["seconds"], "ranges_per_s": len(ranges) / got["seconds"],
                         "mib_per_s": total / got["seconds"] / 2**20,
                         "cpu_s_per_1000": 1000 * got["cpu_s"] / len(ranges),
                         "moto_cpu_s_per_1000": 1000 * moto_cpu / len(ranges),
                         "proxy_and_http_cpu_s_per_1000": 1000 * here_cpu / len(ranges)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def listing_set(image: Path, count: int, scratch: Path) -> Path:
    """``count`` shards of one sample each (``image``), with their indexes and manifest."""
    folder = scratch / "listing-images" / "class_0"
    folder.mkdir(parents=True)
    for number in range(count):
        shutil.copyfile(image, folder / f"img_{number:06d}{image.suffix}")
    out = scratch / "listing-shards"
    out.mkdir()
    convert(folder.parent, str(out / "train-%06d.tar"), shard_size=1)
    return out


def listing_times(shards: Path, count: int, endpoint: str, proxy: FaultProxy, latency_ms: float,
                  scratch: Path) -> dict[str, Any]:
    prefix = f"s3://{BUCKET}/listing"
    pattern = f"{prefix}/train-{{000000..{count - 1:06d}}}.tar"
    store = ObjectStore("s3", {"endpoint_url": endpoint})
    os.environ["XDG_CACHE_HOME"] = str(scratch / f"listing-cache-{latency_ms:g}")
    row: dict[str, Any] = {"latency_ms": latency_ms, "shards": count}
    for kind in ("cold", "warm"):   # the warm listing finds each shard's in the node's listing cache
        proxy.requests.clear()
        started = time.perf_counter()
        listing = list_webdataset(pattern, DEFAULT_IMAGE_KEYS, store=store)
        row[f"{kind}_s"] = time.perf_counter() - started
        row[f"{kind}_requests"] = dict(proxy.requests)
    row["samples"] = len(listing)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", default=str(REPO / "data" / "sample"), help="ImageFolder to convert")
    parser.add_argument("--pipeline", default=str(REPO / "pipelines" / "imagenet_train.yaml"))
    parser.add_argument("--backends", default="dali-cpu,torchvision")
    parser.add_argument("--latency-ms", default="0,20", help="added latency per request, comma-separated")
    parser.add_argument("--max-requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--workers", type=int, default=None, help="loader.workers (default: the pipeline's)")
    parser.add_argument("--ranges", type=int, default=2000, help="ranged reads per client and latency")
    parser.add_argument("--listing-shards", type=int, default=1024)
    parser.add_argument("--parts", default="epochs,ranged,listing", help="what to measure, comma-separated")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 0 ms only, torchvision, batch 8, no workers, 16 listing shards, "
                             "64 ranges")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "object_storage.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_ms, args.backends, args.batch_size, args.shard_size = "0", "torchvision", 8, 10
        args.ranges, args.listing_shards, args.workers = 64, 16, 0

    os.environ.update(AWS_ACCESS_KEY_ID="benchmark-key-id", AWS_SECRET_ACCESS_KEY="benchmark-secret",
                      AWS_DEFAULT_REGION="us-east-1")
    record: dict[str, Any] = {"format": OBJECT_STORAGE_FORMAT, "quick": args.quick,
                              "command": " ".join(["benchmarks/object_storage.py", *(argv or sys.argv[1:])]),
                              "pipeline": Path(args.pipeline).stem, "batch_size": args.batch_size,
                              "max_requests": args.max_requests, "epochs": [], "ranged_reads": [], "listing": []}
    moto, endpoint = start_moto()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-s3-") as scratch_dir:
            run_all(args, Path(scratch_dir), endpoint, moto.pid, record)
    finally:
        moto.terminate()
        moto.wait()
    record["machine"] = {"platform": platform.platform(), "python": platform.python_version(),
                         "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def start_moto() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own on 127.0.0.1 (not a thread of this one, whose GIL the
    proxies use): (the process, its endpoint)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex((LOOPBACK, port)) == 0:
                return process, f"http://{LOOPBACK}:{port}"
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto's server did not start on {LOOPBACK}:{port} within 60 s")


def run_all(args: argparse.Namespace, scratch: Path, endpoint: str, moto_pid: int, record: dict[str, Any]) -> None:
    shards = scratch / "served" / "train"   # served over HTTP too, as http://HOST/train/train-000000.tar
    shards.mkdir(parents=True)
    result = convert(args.data, str(shards / "train-%06d.tar"), shard_size=args.shard_size)
    record["samples"] = json.loads(Path(result.manifest).read_text())["samples"]
    os.environ["XDG_CACHE_HOME"] = str(scratch / "cache-home")   # listings cached here, never in ~/.cache
    prefix = upload_folder(endpoint, shards, BUCKET, "train")
    pattern = Path(result.pattern).name
    image = next(p for p in sorted(Path(args.data).rglob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    listing_shards = listing_set(image, args.listing_shards, scratch)
    upload_folder(endpoint, listing_shards, BUCKET, "listing")
    samples = list_webdataset(f"{prefix}/{pattern}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3")).shards
    ranges = [Range(samples.shards[int(samples.shard[i])], int(samples.offset[i]), int(samples.size[i]))
              for i in range(min(args.ranges, len(samples)))]
    http_server, http_base = serve_folder(scratch / "served")
    parts = set(args.parts.split(","))
    for latency_ms in (float(x) for x in args.latency_ms.split(",")):
        proxy = FaultProxy(endpoint.split("://", 1)[1], latency=latency_ms / 1000)
        http_proxy = FaultProxy(http_base.split("://", 1)[1], latency=latency_ms / 1000)
        os.environ["XDG_CACHE_HOME"] = str(scratch / f"cache-home-{latency_ms:g}")
        if "epochs" in parts:
            epochs(args, scratch, latency_ms, {"local": str(shards / pattern), "s3": f"{prefix}/{pattern}",
                                               "http": f"{http_proxy.endpoint}/train/{pattern}"},
                   {"s3": proxy, "http": http_proxy}, record)
        if "ranged" in parts:
            targets = {"moto via the proxy": ("s3", proxy.endpoint),
                       "HTTP server via the proxy": ("http", http_proxy.endpoint)}
            if latency_ms == 0:   # the servers' own ceilings, no proxy between
                targets.update({"moto": ("s3", endpoint), "HTTP server": ("http", http_base)})
            record["ranged_reads"] += ranged_read_rates(ranges, targets, args.max_requests, latency_ms, moto_pid)
        if "listing" in parts:
            record["listing"].append(listing_times(listing_shards, args.listing_shards, proxy.endpoint, proxy,
                                                   latency_ms, scratch))
        proxy.close()
        http_proxy.close()
    http_server.shutdown()


def epochs(args: argparse.Namespace, scratch: Path, latency_ms: float, where: dict[str, str],
           proxies: dict[str, FaultProxy], record: dict[str, Any]) -> None:
    """An epoch per backend and mode: local shards, ranged reads from moto and from the HTTP server, the
    cache; with the most ranged GETs in flight at once (the proxy counts them) for the remote modes."""
    remote = {"type": "webdataset", "shards": where["s3"], "max_requests": args.max_requests,
              "storage_options": {"endpoint_url": proxies["s3"].endpoint}}
    modes = {"local": {"type": "webdataset", "shards": where["local"]}, "ranged": remote,
             "ranged-http": {"type": "webdataset", "shards": where["http"], "max_requests": args.max_requests},
             "cache": {**remote, "cache": {"dir": str(scratch / f"cache-{latency_ms:g}"), "max_bytes": "100GB"}}}
    for backend in args.backends.split(","):
        for mode, source in modes.items():
            overrides = {"source": source, "batch_size": args.batch_size,
                         **({"loader.workers": args.workers} if args.workers is not None else {})}
            proxy = proxies["http" if mode == "ranged-http" else "s3"]
            proxy.peak = 0
            figures = epoch(Path(args.pipeline), backend, overrides)
            if mode != "local":
                figures["peak_in_flight"] = proxy.peak
            record["epochs"].append({"latency_ms": latency_ms, "mode": mode, "backend": backend, **figures})
            print(json.dumps(record["epochs"][-1]), flush=True)

if __name__ == "__main__":
    sys.exit(main())
