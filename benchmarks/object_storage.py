"""Shards in object storage against the same shards on local disk: what the loader's client costs
per image, apart from what the test servers cost.

Converts an image folder to shards and serves them from three servers on 127.0.0.1, each with a
fixed delay added to every request inside the server, where waiting costs no CPU (a sleeping
thread, or nginx's timer): moto's S3 server (a process of its own, each request's WSGI thread
sleeping before it is handled), Python's threading HTTP server (in this process, each request's
thread sleeping after its request line and headers are read) and nginx (the system's package, its
echo module's ``echo_sleep`` before the file is served; skipped, with the reason, where either is
not installed). For each backend and way of reading (``--access``), epochs of a pipeline
(``imagenet_train``), each in a process of its own: from local disk, then from each server at each
delay (0, 20 and 100 ms by default) one after the other, each server followed by local disk again —
each ratio against the local epochs just before and after its server's, as the machine's speed
drifts over a run. The ways of reading:

* **ranged**: each sample one ranged GET, in a global shuffle (no ``source.cache``);
* **cached**: whole shards downloaded into a node cache (``source.cache``) in the shard-window order
  (``loader.shuffle: shards``, windows of ``--window`` shards), which reads the next shards ahead
  while the current ones are decoded, and the next epoch's first window while an epoch ends. The
  cache has room for two windows, so each epoch evicts the shards the next one needs and
  downloads nearly every shard again — every epoch of a dataset larger than the cache — one GET
  per shard instead of one per sample (the shards downloaded per epoch are counted). Its local
  reference reads the same local shards in the same order.

For each:

* **the loader's CPU per image**: user + system CPU seconds of the loader's process tree (the
  process, its threads and its DataLoader workers, read from /proc) over a whole epoch, divided by
  its images — the servers run in other processes, so their CPU is not in it; beside it the CPU
  the server's processes spent in the same epochs, per image. The epochs measured (``--measured-epochs``,
  together) follow the process's first, which starts the workers and their clients, lists the
  shards and times the first batch, as a training job does once;
* **img/s** of that epoch (on a machine whose cores the servers share, the servers' CPU comes out
  of the decode's: there img/s says less than CPU per image).

Goals, per access: the loader's CPU per image over S3 and HTTP at most 1.10 × local shards' (on a
host with many cores, against storage on other machines, that ratio is what bounds the epoch);
img/s at 100 ms at least 95 % of 0 ms on the same server. ``--parts ranged`` adds ranged reads with
nothing to decode per client (the bridge's, s3fs's own calls, obstore) and server, ``--parts
listing`` the listing of ``--listing-shards`` shards, cold and warm.

It writes one results file (``--out``, by default ``benchmarks/results/object_storage.json``) with
the machine and the command, which ``python -m dali_bridge.bench readme`` renders.

    .venv/bin/python benchmarks/object_storage.py --data data/sample
    .venv/bin/python benchmarks/object_storage.py --quick --data DIR --out /tmp/object_storage.json  # smoke run

``--quick`` (0 ms, torchvision, batch 8, no workers) only checks that the script works: its
figures say nothing, and the report says so. Needs moto[server] and s3fs (the test extra; obstore
for ``--parts ranged``: the bench extra) and, for the nginx rows, ``apt-get install nginx
libnginx-mod-http-echo``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import platform
import resource
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the loopback servers live with the tests (tests.helpers): one copy of them

from tests.helpers.nginx_fixtures import Nginx, missing_reason  # noqa: E402
from tests.helpers.s3_fixtures import LOOPBACK, FaultProxy, free_port, serve_folder, upload_folder  # noqa: E402

from dali_bridge import build_loader  # noqa: E402
from dali_bridge.bench.procstats import process_tree, tree_cpu_seconds  # noqa: E402
from dali_bridge.bench.storage_report import OBJECT_STORAGE_FORMAT  # noqa: E402
from dali_bridge.tools.convert import convert  # noqa: E402
from dali_bridge.data.sources.webdataset import list_webdataset  # noqa: E402
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS  # noqa: E402
from dali_bridge.data.storage.store import ObjectStore, Range  # noqa: E402

BUCKET = "bench-bucket"
# Not the kernel's tc netem on loopback: it needs the sch_netem module (absent from some kernels, this
# benchmark's machine's among them) and delays every process's loopback traffic, not only the servers'.
DELAY = ("added inside each server, costing no CPU while it runs: moto's WSGI thread and Python's HTTP "
         "server's request thread sleep before answering; nginx's echo_sleep timer runs before the file is "
         "served")


def _own_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of exactly these processes (their threads; not their children)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, workers) / 1024   # Linux reports KiB


def _one_epoch(loader: Any) -> tuple[int, float, float]:
    """(images, seconds, seconds to the first batch) of one pass over ``loader``."""
    started = time.perf_counter()
    first, images = None, 0
    for batch in loader:
        images += len(batch[0])
        if first is None:
            first = time.perf_counter() - started
    return images, time.perf_counter() - started, first or 0.0


def _count_downloads() -> Any:
    """A count of the shard cache's downloads, shared with the DataLoader workers forked later (the
    library keeps none: its download is wrapped here, in the epoch's process only)."""
    from dali_bridge.data.shards.cache import ShardCache

    counter = multiprocessing.Value("q", 0)
    fill = ShardCache._fill

    def counted(self: ShardCache, descriptor: int, shard: Any) -> None:
        fill(self, descriptor, shard)
        with counter.get_lock():
            counter.value += 1

    ShardCache._fill = counted
    return counter


def _epochs_in_child(pipeline: str, backend: str, overrides: dict[str, Any], server_pids: list[int],
                     measured: int, queue: Any) -> None:
    # A spawned process inherits "spawn" as its default start method, so its DataLoader workers
    # would be spawned too, each importing this script and torch again before its first batch
    # (seconds): a training script's workers start the platform's default way, as here.
    multiprocessing.set_start_method(None, force=True)
    downloads = _count_downloads()
    loader = build_loader(pipeline, backend, overrides=overrides)
    _, _, first_batch_s = _one_epoch(loader)   # workers, their clients and connections started
    images, seconds, cpu, server_cpu = 0, 0.0, 0.0, 0.0
    downloads_before = downloads.value
    for _ in range(measured):   # the workers persist: the tree's CPU is read with all of them alive
        cpu_before, server_before = tree_cpu_seconds(), _own_cpu_seconds(server_pids)
        count, took, _ = _one_epoch(loader)
        cpu += tree_cpu_seconds() - cpu_before
        server_cpu += _own_cpu_seconds(server_pids) - server_before
        images, seconds = images + count, seconds + took
    loader.close()
    queue.put({"images": images, "seconds": seconds, "images_per_s": images / seconds,
               "loader_cpu_ms_per_image": 1000 * cpu / images,
               "server_cpu_ms_per_image": 1000 * server_cpu / images if server_pids else None,
               "first_batch_s": first_batch_s, "peak_rss_mib": _peak_rss_mib(),
               "shard_downloads_per_epoch": (downloads.value - downloads_before) / measured
               if overrides["source"].get("cache") else None})


def epoch(pipeline: Path, backend: str, overrides: dict[str, Any], server_pids: list[int], *,
          measured: int) -> dict[str, Any]:
    """A warm-up epoch then ``measured`` epochs in a spawned process of its own, the latter measured
    together: their figures, or why it failed."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_epochs_in_child,
                            args=(str(pipeline), backend, overrides, server_pids, measured, queue))
    child.start()
    child.join()
    if child.exitcode != 0 or queue.empty():
        return {"error": f"the epoch's process ended with exit code {child.exitcode}"}
    return queue.get()


# ---- the servers, each delaying every request without spending CPU on the delay


def _moto_in_child(port: int, delay_ms: Any) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # a log line per request is CPU moto's alone would not
    app = DomainDispatcherApplication(create_backend_app)

    def delayed(environ: dict, start_response: Any) -> Any:
        if delay_ms.value:
            time.sleep(delay_ms.value / 1000)   # this request's thread only: the others go on
        return app(environ, start_response)

    run_simple(LOOPBACK, port, delayed, threaded=True, request_handler=MotoRequestHandler)


def start_moto(delay_ms: Any) -> tuple[multiprocessing.Process, str]:
    """moto's S3 server in a process of its own on 127.0.0.1 (not a thread of this one, whose GIL the
    HTTP server uses), delaying each request by ``delay_ms.value``: (the process, its endpoint)."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=_moto_in_child, args=(port, delay_ms), daemon=True)
    process.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.is_alive():
        with socket.socket() as probe:
            if probe.connect_ex((LOOPBACK, port)) == 0:
                return process, f"http://{LOOPBACK}:{port}"
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto's server did not start on {LOOPBACK}:{port} within 60 s")


def delay_requests(server: Any) -> None:
    """Make Python's HTTP server ``server`` wait ``server.delay_s`` in each request's own thread,
    after its request line and headers are read (``server.delay_s`` may change between requests)."""
    server.delay_s = 0.0

    class Delayed(server.RequestHandlerClass):
        def parse_request(self) -> bool:
            parsed = super().parse_request()
            if parsed and self.server.delay_s:
                time.sleep(self.server.delay_s)
            return parsed

    server.RequestHandlerClass = Delayed


# ---- ranged reads with nothing to decode (--parts ranged)


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


def ranged_read_rates(ranges: list[Range], servers: dict[str, dict[str, Any]], max_requests: int,
                      latency_ms: float) -> list[dict]:
    """Each client of a server's scheme reading ``ranges`` (``s3://`` URLs; over HTTP the same keys under
    the server) in a process of its own, so its CPU is the client's alone; beside it the CPU seconds the
    server's processes spent meanwhile, per 1,000 GETs."""
    total = sum(r.size for r in ranges)
    rows = []
    context = multiprocessing.get_context("spawn")
    for name, server in servers.items():
        asked = ranges if server["scheme"] == "s3" else [
            Range(r.url.replace(f"s3://{BUCKET}", "http://server", 1), r.start, r.size) for r in ranges]
        for client in (c for c, (scheme, _) in CLIENTS.items() if scheme == server["scheme"]):
            row: dict[str, Any] = {"latency_ms": latency_ms, "server": name, "client": client,
                                   "ranges": len(ranges), "max_requests": max_requests}
            queue = context.Queue()
            child = context.Process(target=_ranged_in_child,
                                    args=(client, asked, server["endpoint"], max_requests, queue))
            before = _own_cpu_seconds(server["pids"])
            child.start()
            child.join()
            server_cpu = _own_cpu_seconds(server["pids"]) - before
            got = queue.get() if child.exitcode == 0 and not queue.empty() else \
                {"skipped": f"its process ended with exit code {child.exitcode}"}
            if "skipped" in got:
                rows.append({**row, **got})
                continue
            rows.append({**row, "seconds": got["seconds"], "ranges_per_s": len(ranges) / got["seconds"],
                         "mib_per_s": total / got["seconds"] / 2**20,
                         "cpu_s_per_1000": 1000 * got["cpu_s"] / len(ranges),
                         "server_cpu_s_per_1000": 1000 * server_cpu / len(ranges)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ---- listing (--parts listing)


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


def listing_times(count: int, endpoint: str, latency_ms: float, scratch: Path) -> dict[str, Any]:
    """A cold listing of ``count`` shards from moto (through a proxy adding nothing, which counts the
    requests), then a warm one from the node's listing cache."""
    proxy = FaultProxy(endpoint.split("://", 1)[1])
    pattern = f"s3://{BUCKET}/listing/train-{{000000..{count - 1:06d}}}.tar"
    store = ObjectStore("s3", {"endpoint_url": proxy.endpoint})
    os.environ["XDG_CACHE_HOME"] = str(scratch / f"listing-cache-{latency_ms:g}")
    row: dict[str, Any] = {"latency_ms": latency_ms, "shards": count}
    for kind in ("cold", "warm"):   # the warm listing finds each shard's in the node's listing cache
        proxy.requests.clear()
        started = time.perf_counter()
        listing = list_webdataset(pattern, DEFAULT_IMAGE_KEYS, store=store)
        row[f"{kind}_s"] = time.perf_counter() - started
        row[f"{kind}_requests"] = dict(proxy.requests)
    row["samples"] = len(listing)
    proxy.close()
    return row


# ---- the run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", default=str(REPO / "data" / "sample"), help="ImageFolder to convert")
    parser.add_argument("--pipeline", default=str(REPO / "pipelines" / "imagenet_train.yaml"))
    parser.add_argument("--backends", default="dali-cpu,torchvision")
    parser.add_argument("--latency-ms", default="0,20,100", help="delay added to every request, comma-separated")
    parser.add_argument("--servers", default="s3-moto,http-python,http-nginx",
                        help="which servers, comma-separated (local shards are always measured)")
    parser.add_argument("--max-requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=250, help="samples per shard")
    parser.add_argument("--access", default="ranged,cached",
                        help="how remote shards are read, comma-separated: ranged (a GET per sample), cached "
                             "(whole shards through source.cache with room for two windows, so every epoch "
                             "downloads again, shard-window order)")
    parser.add_argument("--window", type=int, default=2, help="loader.shuffle_window of the cached access")
    parser.add_argument("--measured-epochs", type=int, default=3,
                        help="epochs measured together after the warm-up epoch, in the same process")
    parser.add_argument("--repeats", type=int, default=2,
                        help="processes per server and delay, the delays taking turns (one process's speed "
                             "varies by a tenth from another's here)")
    parser.add_argument("--workers", type=int, default=None, help="loader.workers (default: the pipeline's)")
    parser.add_argument("--ranges", type=int, default=2000, help="ranged reads per client and latency (--parts ranged)")
    parser.add_argument("--listing-shards", type=int, default=1024, help="shards listed (--parts listing)")
    parser.add_argument("--parts", default="epochs", help="what to measure, comma-separated: epochs, ranged, listing")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 0 ms only, torchvision, batch 8, no workers, 16 listing shards, 64 ranges")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "object_storage.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_ms, args.backends, args.batch_size, args.shard_size = "0", "torchvision", 8, 10
        args.window, args.measured_epochs, args.repeats = 2, 1, 1
        args.ranges, args.listing_shards, args.workers = 64, 16, 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    os.environ.update(AWS_ACCESS_KEY_ID="benchmark-key-id", AWS_SECRET_ACCESS_KEY="benchmark-secret",
                      AWS_DEFAULT_REGION="us-east-1")
    record: dict[str, Any] = {"format": OBJECT_STORAGE_FORMAT, "quick": args.quick,
                              "command": " ".join(["benchmarks/object_storage.py", *(argv or sys.argv[1:])]),
                              "pipeline": Path(args.pipeline).stem, "batch_size": args.batch_size,
                              "workers": args.workers, "max_requests": args.max_requests, "delay": DELAY,
                              "access": {}, "shard_size": args.shard_size, "measured_epochs": args.measured_epochs,
                              "repeats": args.repeats,
                              "servers": {}, "epochs": [], "ranged_reads": [], "listing": []}
    moto_delay = multiprocessing.get_context("spawn").Value("d", 0.0)
    moto, endpoint = start_moto(moto_delay)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    load = [os.getloadavg()[0]]
    try:
        with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-s3-") as scratch_dir:
            run_all(args, Path(scratch_dir), endpoint, moto, moto_delay, record, load)
    finally:
        moto.terminate()
        moto.join()
    record["machine"] = {"platform": platform.platform(), "python": platform.python_version(),
                         "cpus": os.cpu_count(), "cpu": _cpu_model(),
                         "load_average": [round(x, 2) for x in os.getloadavg()],
                         "load_average_1min_range": [round(min(load), 2), round(max(load), 2)]}
    record["run_s"] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out} ({record['run_s']:.0f} s)")
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def start_servers(args: argparse.Namespace, served: Path, endpoint: str, moto: Any, record: dict[str, Any]
                  ) -> tuple[dict[str, dict[str, Any]], Any]:
    """The servers asked for that can run here: name → scheme, endpoint, process ids (for their CPU).
    nginx is started per delay (``restart_nginx``); where it cannot run, the reason is recorded."""
    wanted = args.servers.split(",")
    servers: dict[str, dict[str, Any]] = {}
    if "s3-moto" in wanted:
        servers["s3-moto"] = {"scheme": "s3", "endpoint": endpoint, "pids": [moto.pid]}
    http_server = None
    if "http-python" in wanted:
        http_server, base = serve_folder(served)
        delay_requests(http_server)
        servers["http-python"] = {"scheme": "http", "endpoint": base, "pids": [os.getpid()]}
    if "http-nginx" in wanted:
        delays = any(float(x) > 0 for x in args.latency_ms.split(","))
        reason = missing_reason(delay=delays)
        if reason:
            record["servers"]["http-nginx"] = {"skipped": reason}
            print(f"nginx rows skipped: {reason}", flush=True)
        else:
            servers["http-nginx"] = {"scheme": "http", "endpoint": None, "pids": [], "process": None}
    return servers, http_server


def set_delay(servers: dict[str, dict[str, Any]], latency_ms: float, moto_delay: Any, http_server: Any,
              served: Path) -> None:
    moto_delay.value = latency_ms
    if http_server is not None:
        http_server.delay_s = latency_ms / 1000
    nginx = servers.get("http-nginx")
    if nginx is not None and nginx.get("delay_ms") != latency_ms:
        # echo_sleep's delay is in nginx's configuration: a fresh nginx per delay
        nginx["delay_ms"] = latency_ms
        if nginx["process"] is not None:
            nginx["process"].stop()
        nginx["process"] = Nginx(served, delay_s=latency_ms / 1000)
        nginx["endpoint"] = nginx["process"].base
        nginx["pids"] = process_tree(nginx["process"].pid)   # the master and its worker


def run_all(args: argparse.Namespace, scratch: Path, endpoint: str, moto: Any, moto_delay: Any,
            record: dict[str, Any], load: list[float]) -> None:
    shards = scratch / "served" / "train"   # served over HTTP too, as http://HOST/train/train-000000.tar
    shards.mkdir(parents=True)
    result = convert(args.data, str(shards / "train-%06d.tar"), shard_size=args.shard_size)
    manifest = json.loads(Path(result.manifest).read_text())
    record["samples"] = manifest["samples"]
    # room for two windows of the largest shard: the window read and the one read ahead
    cache_bytes = 2 * args.window * max(os.path.getsize(path) for path in result.shards)
    record["access"] = access_record(args, shards=len(result.shards))
    os.environ["XDG_CACHE_HOME"] = str(scratch / "cache-home")   # listings cached here, never in ~/.cache
    prefix = upload_folder(endpoint, shards, BUCKET, "train")
    pattern = Path(result.pattern).name
    parts = set(args.parts.split(","))
    if "listing" in parts:
        image = next(p for p in sorted(Path(args.data).rglob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        upload_folder(endpoint, listing_set(image, args.listing_shards, scratch), BUCKET, "listing")
    samples = list_webdataset(f"{prefix}/{pattern}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3")).shards
    ranges = [Range(samples.shards[int(samples.shard[i])], int(samples.offset[i]), int(samples.size[i]))
              for i in range(min(args.ranges, len(samples)))]
    servers, http_server = start_servers(args, scratch / "served", endpoint, moto, record)
    latencies = [float(x) for x in args.latency_ms.split(",")]
    try:
        if "epochs" in parts:
            epochs(args, latencies, {name: f"{prefix}/{pattern}" if server["scheme"] == "s3" else
                                     f"/train/{pattern}" for name, server in servers.items()},
                   str(shards / pattern), servers, record, load, moto_delay=moto_delay, http_server=http_server,
                   served=scratch / "served", cache_root=scratch / "node-cache", cache_bytes=cache_bytes)
        for latency_ms in latencies if parts & {"ranged", "listing"} else []:
            set_delay(servers, latency_ms, moto_delay, http_server, scratch / "served")
            if "ranged" in parts:
                record["ranged_reads"] += ranged_read_rates(ranges, servers, args.max_requests, latency_ms)
            if "listing" in parts:
                record["listing"].append(listing_times(args.listing_shards, endpoint, latency_ms, scratch))
    finally:
        if "http-nginx" in servers and servers["http-nginx"]["process"] is not None:
            servers["http-nginx"]["process"].stop()
        if http_server is not None:
            http_server.shutdown()
    for name, server in servers.items():
        record["servers"][name] = {"scheme": server["scheme"]}


def access_record(args: argparse.Namespace, *, shards: int) -> dict[str, dict[str, Any]]:
    """What each access measured reads, as the results file states it."""
    described = {
        "ranged": {"description": "each sample one ranged GET, global shuffle, no source.cache"},
        "cached": {"description": f"the {shards} shards downloaded whole into source.cache and read from there, "
                                  f"loader.shuffle: shards, window {args.window} shards; the cache holds two "
                                  f"windows, so each epoch downloads again the shards the one before evicted; "
                                  f"its local reference reads in the same order",
                   "shards": shards, "window": args.window}}
    return {access: described[access] for access in args.access.split(",")}


def source_overrides(args: argparse.Namespace, *, access: str, mode: str, shards: str,
                     servers: dict[str, dict[str, Any]], cache_dir: Path, cache_bytes: int) -> dict[str, Any]:
    """The pipeline overrides of one epoch: where its shards are and how they are read."""
    source: dict[str, Any] = {"type": "webdataset", "shards": shards}
    if mode != "local":
        source["max_requests"] = args.max_requests
    if mode == "s3-moto":
        source["storage_options"] = {"endpoint_url": servers[mode]["endpoint"]}
    overrides: dict[str, Any] = {"batch_size": args.batch_size}
    if access == "cached":
        overrides.update({"loader.shuffle": "shards", "loader.shuffle_window": args.window})
        if mode != "local":   # a cache of its own, smaller than the dataset: every epoch downloads
            source["cache"] = {"dir": str(cache_dir), "max_bytes": cache_bytes}
    if args.workers is not None:
        overrides["loader.workers"] = args.workers
    return {"source": source, **overrides}


def epochs(args: argparse.Namespace, latencies: list[float], where: dict[str, str], local: str,
           servers: dict[str, dict[str, Any]], record: dict[str, Any], load: list[float], *, moto_delay: Any,
           http_server: Any, served: Path, cache_root: Path, cache_bytes: int) -> None:
    """Per backend and access: an epoch from local shards, then each server's epochs at every delay one
    after the other (``--repeats`` times, taking turns), each server followed by local shards again.
    The machine's speed drifts over a run (the same local epochs measured ten minutes apart differed
    by up to a fifth on the benchmark's machine): each ratio is taken against the local epochs just
    before and after its server's."""
    for backend in args.backends.split(","):
        for access in args.access.split(","):
            _local_epoch(args, backend, access, local, record, load, cache_bytes=cache_bytes)
            for mode in where:   # each server's delays between two local references
                for repeat, latency_ms in ((r, ms) for r in range(args.repeats) for ms in latencies):
                    set_delay(servers, latency_ms, moto_delay, http_server, served)
                    # HTTP shards are named on the server's endpoint, which a fresh nginx (one per delay) changes
                    shards = where[mode] if servers[mode]["scheme"] == "s3" else servers[mode]["endpoint"] + where[mode]
                    os.environ["XDG_CACHE_HOME"] = str(cache_root.parent / f"cache-home-{latency_ms:g}")
                    overrides = source_overrides(args, access=access, mode=mode, shards=shards, servers=servers,
                                                 cache_dir=cache_root / f"{backend}-{mode}-{latency_ms:g}-{repeat}",
                                                 cache_bytes=cache_bytes)
                    _record(record, load, latency_ms, mode, backend, access,
                            epoch(Path(args.pipeline), backend, overrides, servers[mode]["pids"],
                                  measured=args.measured_epochs))
                _local_epoch(args, backend, access, local, record, load, cache_bytes=cache_bytes)


def _local_epoch(args: argparse.Namespace, backend: str, access: str, local: str, record: dict[str, Any],
                 load: list[float], *, cache_bytes: int) -> None:
    overrides = source_overrides(args, access=access, mode="local", shards=local, servers={},
                                 cache_dir=Path("unused"), cache_bytes=cache_bytes)
    _record(record, load, 0.0, "local", backend, access,
            epoch(Path(args.pipeline), backend, overrides, [], measured=args.measured_epochs))


def _record(record: dict[str, Any], load: list[float], latency_ms: float, mode: str, backend: str, access: str,
            figures: dict[str, Any]) -> None:
    load.append(os.getloadavg()[0])
    record["epochs"].append({"latency_ms": latency_ms, "mode": mode, "backend": backend, "access": access, **figures})
    print(json.dumps(record["epochs"][-1]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
