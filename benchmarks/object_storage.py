"""Shards in object storage against the same shards on local disk: images/s and first batch.

Starts moto's S3 server on 127.0.0.1 and, in front of it, the tests' fault proxy adding a fixed
latency to every request (0 and 20 ms by default), converts the sample set to shards, uploads
them, and runs one epoch of a pipeline per (latency, mode, backend):

* ``local``: the shards on local disk (the reference);
* ``ranged``: ``s3://`` shards, each sample one ranged GET, a batch's GETs concurrent;
* ``cache``: ``s3://`` shards through ``source.cache`` (a cold cache at the start of the run).

For each it records images/s over the epoch, the seconds to the first batch and the process's
peak RSS, and writes them with the machine and the command to ``--out`` (JSON). Goals: at 20 ms
without a cache at least 90 % of local images/s, first batch within 2 s, memory bounded by
``max_requests`` × sample size.

    .venv/bin/python benchmarks/object_storage.py --data data/sample
    .venv/bin/python benchmarks/object_storage.py --latency-ms 0,20 --backends torchvision --max-requests 64

Needs the test extra (moto[server], s3fs). Run it on an otherwise idle machine: figures taken
under load say nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the loopback servers live with the tests: one copy of them

from s3_fixtures import FaultProxy, upload_folder  # noqa: E402

from dali_bridge import build_loader  # noqa: E402
from dali_bridge.convert import convert  # noqa: E402


def epoch(pipeline: Path, backend: str, source: dict[str, Any], batch_size: int) -> dict[str, float]:
    loader = build_loader(pipeline, backend, overrides={"source": source, "batch_size": batch_size})
    started = time.perf_counter()
    first = None
    images = 0
    for batch in loader:
        images += len(batch[0])
        if first is None:
            first = time.perf_counter() - started
    seconds = time.perf_counter() - started
    loader.close()
    return {"images": images, "seconds": seconds, "images_per_s": images / seconds, "first_batch_s": first or 0.0,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", default=str(REPO / "data" / "sample"), help="ImageFolder to convert")
    parser.add_argument("--pipeline", default=str(REPO / "pipelines" / "imagenet_train.yaml"))
    parser.add_argument("--backends", default="dali-cpu,torchvision")
    parser.add_argument("--latency-ms", default="0,20", help="added latency per request, comma-separated")
    parser.add_argument("--max-requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "object_storage.json"))
    args = parser.parse_args(argv)

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="benchmark-key-id", AWS_SECRET_ACCESS_KEY="benchmark-secret",
                      AWS_DEFAULT_REGION="us-east-1")
    runs = []
    with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-s3-") as scratch:
        shards = Path(scratch) / "shards"
        shards.mkdir()
        result = convert(args.data, str(shards / "train-%06d.tar"), shard_size=args.shard_size)
        prefix = upload_folder(endpoint, shards, "bench-bucket", "train")
        pattern = Path(result.pattern).name
        os.environ["XDG_CACHE_HOME"] = str(Path(scratch) / "listing-cache")
        for latency_ms in (float(x) for x in args.latency_ms.split(",")):
            proxy = FaultProxy(f"{host}:{port}", latency=latency_ms / 1000)
            remote = {"type": "webdataset", "shards": f"{prefix}/{pattern}", "max_requests": args.max_requests,
                      "storage_options": {"endpoint_url": proxy.endpoint}}
            modes = {"local": {"type": "webdataset", "shards": str(shards / pattern)}, "ranged": remote,
                     "cache": {**remote, "cache": {"dir": str(Path(scratch) / f"cache-{latency_ms:g}"),
                                                   "max_bytes": "100GB"}}}
            for backend in args.backends.split(","):
                for mode, source in modes.items():
                    figures = epoch(Path(args.pipeline), backend, source, args.batch_size)
                    runs.append({"latency_ms": latency_ms, "mode": mode, "backend": backend, **figures})
                    print(json.dumps(runs[-1]))
            proxy.close()
    server.stop()
    record = {"command": " ".join(["benchmarks/object_storage.py", *(argv or sys.argv[1:])]),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg()}, "runs": runs}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
