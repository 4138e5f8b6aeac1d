"""The torchvision backend's per-sample work on a Ray cluster: ``loader.executor: ray``.

Each batch is one Ray task: on a cluster's CPU node, the per-sample core (the torchvision backend's
:class:`~dali_bridge.backends.torchvision.BatchDataset`: read, checks, decode, draws, the ``on_error``
policy, every op up to the finish) makes the batch's uint8 pixels, which come back through Ray's
object store; the finish and the ops after it run here, on the loader's device. The core and its
draws are the same code as local workers', so the batches are theirs bit for bit.

Ray does the scheduling, the transport and the retries: a task whose worker process (or node) dies
is run again by Ray (``max_retries``), and because a task's result is a pure function of its
:class:`~dali_bridge.pipeline.sampling.BatchTask`, a retry gives the same batch. The results are taken
in the tasks' order, one object reference per batch, so a retry never loses, repeats or reorders a
sample. At most ``loader.ray.batches_in_flight`` batches are submitted and not yet taken, and at
most ``loader.ray.cpus`` of them are running: what this rank holds in the object store is bounded
by ``batches_in_flight`` uint8 batches, and a slow node holds the loop back only once the window
behind its batch is full (:meth:`RayExecutor.stats` counts those waits).

A cluster that goes away (its head's GCS no longer answers) ends the iteration with a
:class:`RayClusterError` naming the address; the loader's state at that batch resumes anywhere.
"""
from __future__ import annotations

import os
import socket
import time
import warnings
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import SampleError
from ..pipeline.plan import Plan
from ..pipeline.sampling import BatchTask
from ..data.sources.listing import Listing
from ..spec.model import RaySettings
from ..spec.pipeline import PipelineSpec
from .base import RawBatch, Topology, default_workers
from .device import on_side_stream, ready_on_consumer
from .finishing import FinishedBuffers, finish_batch
from .torchvision import BatchDataset, prefetched

RAY_EXTRA = "pip install 'dali-bridge[ray]'"
# Ray runs a task again when its worker process or node dies, up to this many times; an error the
# task itself raises is not retried (the core returns sample errors as data, so one would be a bug).
TASK_RETRIES = 3
# How often a wait for a batch looks whether the cluster still answers.
POLL_SECONDS = 1.0
# A head whose GCS port refuses or does not take a connection within this long is gone.
PROBE_SECONDS = 5.0
# A wait for the next batch longer than this counts as a stall in the executor's figures.
STALL_SECONDS = 0.001
# A Ray Client head starts a server process for each client; when that process dies as it starts, the
# head answers "Initialization failure from server" and a new connection gets a new process.
CLIENT_ATTEMPTS = 3


class RayClusterError(RuntimeError):
    """The Ray cluster cannot be reached, or went away during an iteration: which address, and what to do."""


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError that names the extra which installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"loader.executor: ray needs Ray, which is not installed ({exc}): {RAY_EXTRA} "
                          f"adds it (every node of the cluster needs the same Ray and dali-bridge)") from None
    return ray


def ray_missing_reason() -> str | None:
    """Why ``executor: ray`` cannot run here (Ray not installed), or None."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return f"Ray is not installed ({exc}): {RAY_EXTRA} adds it"
    return None


# Per Ray worker process: the datasets its tasks made batches of, by their object's id, so a
# worker deserialises a loader's listing and plan once, not once per batch. A few loaders' worth.
_DATASETS: OrderedDict[str, BatchDataset] = OrderedDict()
_KEEP_DATASETS = 4


def make_batch(holder: list, task: BatchTask) -> dict[str, Any]:
    """One batch on a Ray worker: the task's samples through the per-sample core, as the item local
    workers hand over (:func:`~dali_bridge.backends.torchvision.as_item`) with the pixels as a uint8
    numpy array (Ray ships numpy arrays through its object store without a copy). ``holder``: a list
    holding the dataset's object reference, so Ray hands it over unresolved and it is fetched once."""
    import ray

    (reference,) = holder
    key = reference.hex()
    dataset = _DATASETS.get(key)
    if dataset is None:
        dataset = _DATASETS[key] = ray.get(reference)
        while len(_DATASETS) > _KEEP_DATASETS:
            _DATASETS.popitem(last=False)
    height, width = dataset.plan.output_size
    item = dataset.batch(task, lambda count: torch.empty((count, 3, height, width), dtype=torch.uint8))
    if "image" in item:
        # In the memory order the worker wrote (NCHW, or NHWC under a channels-last view: see
        # backends/torchvision.in_layout_of), so Ray ships the array without a copy.
        image = item["image"]
        item["channels_last"] = not image.is_contiguous()
        item["image"] = image.permute(0, 2, 3, 1).numpy() if item["channels_last"] else image.numpy()
    return item


class RayExecutor:
    """Batches made by Ray tasks on a cluster's CPUs, taken in order; finished on the loader's device."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, topology: Topology,
                 device: str | torch.device):
        require_ray()
        self.spec, self.listing, self.plan, self.topology = spec, listing, plan, topology
        self.device = torch.device(device)
        self.settings = spec.loader.ray or RaySettings()
        self.dataset = BatchDataset(spec, listing, plan, spare_buffers=1)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._finished = FinishedBuffers()
        self._owned = False          # this executor started the local cluster (and stops it)
        self._address = ""           # the cluster's address, as errors name it
        self._gcs: tuple[str, int] | None = None
        self._remote: Any = None
        self._reference: Any = None  # the dataset in the object store
        self.cpus = self.in_flight = 0
        self._figures = {"batches": 0, "startup_s": 0.0, "wait_s": 0.0, "stalls": 0, "stall_s": 0.0,
                         "longest_stall_s": 0.0, "connect_retries": 0}

    # ---- the cluster
    def _connect(self) -> Any:
        """Ray, connected (to the address, a local cluster, or the connection this process has)."""
        ray = require_ray()
        if self._remote is not None and ray.is_initialized():
            return ray
        address = self.settings.address
        connected = ray.is_initialized()
        if not connected:
            self._start(ray, address)
        gcs = getattr(ray.get_runtime_context(), "gcs_address", None)
        if connected or address == "auto":  # the address Ray resolved
            self._address = gcs or "the cluster this process is connected to"
        else:
            self._address = address or f"127.0.0.1 (a local cluster{f', GCS {gcs}' if gcs else ''})"
        if gcs and not (address or "").startswith("ray://"):  # Ray Client: the client server says it
            host, _, port = gcs.rpartition(":")
            self._gcs = (host.strip("[]"), int(port))
        cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
        # auto: all of a local cluster (each rank starts its own with its share of the cores), a running
        # cluster's CPUs shared by the ranks
        shared_by = 1 if self._owned else max(1, self.topology.world_size)
        self.cpus = self.settings.cpus or max(1, cluster_cpus // shared_by)
        self.in_flight = self.settings.batches_in_flight or 2 * self.cpus
        self._remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(make_batch)
        self._reference = ray.put(self.dataset)
        return ray

    def _start(self, ray: Any, address: str | None) -> None:
        """Connect to ``address``, or start a local cluster (on 127.0.0.1, with this rank's share of
        the cores) that this executor stops when it closes."""
        # The workers import the same dali_bridge as this process (a source checkout included).
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        try:
            if address is None:
                cpus = self.settings.cpus or (self.spec.loader.workers or default_workers())
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                         log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
                self._owned = True
            else:
                self._check_reachable(address)
                self._init_remote(ray, address)
        except Exception as exc:
            where = f"at {address}" if address else "(a local cluster on 127.0.0.1)"
            raise RayClusterError(f"loader.executor: ray cannot reach the Ray cluster {where}: "
                                  f"{type(exc).__name__}: {exc}. Start one (`ray start --head`, docs/ray.md), set "
                                  f"loader.ray.address to its address, or leave it out for a local cluster") from exc

    def _init_remote(self, ray: Any, address: str) -> None:
        """``ray.init`` on a running cluster; through Ray Client, tried again (with a warning) when the
        head's server for this client failed to start, up to ``CLIENT_ATTEMPTS`` times."""
        attempts = CLIENT_ATTEMPTS if address.startswith("ray://") else 1
        for attempt in range(1, attempts + 1):
            try:
                ray.init(address=address, log_to_driver=False)
                return
            except ConnectionAbortedError as exc:
                ray.shutdown()  # the failed client stays registered until shut down
                if attempt == attempts:
                    raise
                self._figures["connect_retries"] += 1
                warnings.warn(f"loader.executor: ray: the Ray Client server at {address} failed to start this "
                              f"client's session (attempt {attempt} of {attempts}: {str(exc).splitlines()[0]}); "
                              f"connecting again", RuntimeWarning, stacklevel=2)

    @staticmethod
    def _check_reachable(address: str) -> None:
        """A ``host:port`` or ``ray://host:port`` that takes no connection, refused at once (Ray itself
        would retry for minutes); ``auto`` is Ray's to find."""
        if address == "auto":
            return
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
        except OSError as exc:
            raise ConnectionError(f"nothing answers at {host}:{port} ({exc})") from None

    def _gone(self) -> bool:
        """Whether the cluster's head no longer takes connections (Ray itself would wait on)."""
        if self._gcs is None:
            return False
        try:
            socket.create_connection(self._gcs, timeout=PROBE_SECONDS).close()
        except OSError:
            return True
        return False

    # ---- the batches
    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        ray = self._connect()
        items = self._ordered(ray, tasks)
        try:
            if self.stream is None:
                yield from prefetched(items, start=self._finish_here, ready=lambda raw: raw, lookahead=0)
            else:  # GPU: copy + finish batch k+1 on a side stream while the consumer works on batch k
                yield from prefetched(items, start=self._finish_on_side_stream, ready=self._ready, lookahead=1)
        finally:
            items.close()

    def _ordered(self, ray: Any, tasks: list[BatchTask]) -> Iterator[dict[str, Any]]:
        """Each task's item, in the tasks' order; at most ``in_flight`` submitted and not taken, at
        most ``cpus`` of them not yet done. Leaving early cancels the batches still in flight."""
        queue: deque[BatchTask] = deque(tasks)
        pending: deque[tuple[BatchTask, Any]] = deque()  # (task, its result's reference), in order
        first = True
        taken = 0
        try:
            while queue or pending:
                self._submit(ray, queue, pending)
                task, head = pending[0]
                started = time.perf_counter()
                while not ray.wait([head], timeout=0, fetch_local=False)[0]:
                    self._await(ray, pending, left=len(pending) + len(queue), number=task.number)
                    self._submit(ray, queue, pending)
                pending.popleft()
                item = self._get(ray, head, number=task.number, left=len(pending) + len(queue) + 1)
                self._count_wait(time.perf_counter() - started, first=first)  # the copy to this node included
                first = False
                taken += 1
                yield item
        except ConnectionError as exc:
            # Ray Client (a ray:// address) lost the head and gave up reconnecting: the head is not probed
            # here (the client server stands for it), so this is how a cluster gone shows.
            if not self._address.startswith("ray://"):
                raise
            pending.clear()
            self._disconnect(ray)
            raise self._gone_error(number=tasks[taken].number, left=len(tasks) - taken) from exc
        finally:
            if ray.is_initialized():  # not after a cluster gone: nothing to cancel there
                for _, reference in pending:
                    ray.cancel(reference, force=False)

    def _submit(self, ray: Any, queue: deque, pending: deque) -> None:
        """Submit the next tasks while the window has room and fewer than ``cpus`` are running."""
        while queue and len(pending) < self.in_flight and self._running(ray, pending) < self.cpus:
            task = queue.popleft()
            pending.append((task, self._remote.remote([self._reference], task)))

    def _get(self, ray: Any, reference: Any, *, number: int, left: int) -> dict[str, Any]:
        """The item of a batch Ray says is done; a cluster gone meanwhile, or a batch whose retries
        all failed, as a :class:`RayClusterError`."""
        try:
            return ray.get(reference)
        except ray.exceptions.RayError as exc:
            if self._gone():
                self._disconnect(ray)
                raise self._gone_error(number=number, left=left) from exc
            raise RayClusterError(f"batch {number} failed on the Ray cluster at {self._address} after Ray's "
                                  f"{TASK_RETRIES} retries: {type(exc).__name__}: {exc}") from exc

    def _gone_error(self, *, number: int, left: int) -> RayClusterError:
        return RayClusterError(
            f"the Ray cluster at {self._address} is gone (its head does not answer): the epoch ends before its "
            f"batch {number} ({left} batches not made). loader.state_dict() holds this point: restart the "
            f"cluster and iterate again after loader.load_state_dict(state), or resume it on local workers "
            f"(loader.executor: processes)")

    def _running(self, ray: Any, pending: deque) -> int:
        """How many of the submitted batches are not done yet."""
        if not pending:
            return 0
        references = [reference for _, reference in pending]
        done, _ = ray.wait(references, num_returns=len(references), timeout=0, fetch_local=False)
        return len(pending) - len(done)

    def _await(self, ray: Any, pending: deque, *, number: int, left: int) -> None:
        """Wait up to :data:`POLL_SECONDS` for one more batch in flight to be done (the head, or one
        whose CPU the next task can take); a cluster gone ends the iteration."""
        references = [reference for _, reference in pending]
        _, running = ray.wait(references, num_returns=len(references), timeout=0, fetch_local=False)
        if running:  # only those: one already done would end the wait at once, and the loop would spin
            ray.wait(running, num_returns=1, timeout=POLL_SECONDS, fetch_local=False)
        if self._gone():
            # Disconnected here: Ray would otherwise wait on for the head, then end this process.
            self._disconnect(ray)
            raise self._gone_error(number=number, left=left)

    def _count_wait(self, seconds: float, *, first: bool) -> None:
        """A wait for the next batch: an iteration's first is its start-up (the workers import and
        fetch the plan), the others are stalls when the batch was not there yet."""
        figures = self._figures
        figures["batches"] += 1
        figures["wait_s"] += seconds
        if first:
            figures["startup_s"] += seconds
        elif seconds > STALL_SECONDS:
            figures["stalls"] += 1
            figures["stall_s"] += seconds
            figures["longest_stall_s"] = max(figures["longest_stall_s"], seconds)

    def stats(self) -> dict[str, Any]:
        """The waits for the cluster since the loader was built: batches taken, seconds waited for the
        next one (``startup_s``: each iteration's first), stalls (later waits for a batch not there
        yet: the cluster behind the loop) and the longest, Ray Client connections tried again, and the
        bounds in force."""
        height, width = self.plan.output_size
        batch_bytes = self.spec.batch_size * 3 * height * width
        return {"executor": "ray", "address": self._address, "cpus": self.cpus, "batches_in_flight": self.in_flight,
                "object_store_bytes_bound": self.in_flight * batch_bytes, **self._figures}

    # ---- the finish, here
    def _pixels(self, item: dict[str, Any]) -> torch.Tensor:
        with warnings.catch_warnings():  # the object store's memory is read-only; the finish only reads it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            pixels = torch.from_numpy(item["image"])
        return pixels.permute(0, 3, 1, 2) if item.get("channels_last") else pixels

    def _finish_here(self, item: dict[str, Any]) -> RawBatch:
        raw = _raw(item)
        raw.image = finish_batch(self._pixels(item), self.plan.finish, self.device, buffers=self._finished)
        return raw

    def _finish_on_side_stream(self, item: dict[str, Any]) -> tuple[RawBatch, torch.cuda.Event]:
        raw = _raw(item)  # a bad sample raises here, before any GPU work
        raw.image, done = on_side_stream(self.stream,
                                         lambda: finish_batch(self._pixels(item), self.plan.finish, self.device))
        return raw, done

    def _ready(self, started: tuple[RawBatch, torch.cuda.Event]) -> RawBatch:
        raw, done = started
        ready_on_consumer(self.device, raw.image, done)
        return raw

    def _disconnect(self, ray: Any) -> None:
        self._owned, self._remote, self._reference, self._gcs = False, None, None, None
        # Also when Ray no longer says it is initialized: a Ray Client that lost its head stays
        # registered (client mode on, a later ray.init in this process fails) until shut down.
        ray.shutdown()

    def close(self) -> None:
        """Stop the local cluster this executor started; a cluster it connected to stays up."""
        if self._owned:
            self._disconnect(require_ray())


def _raw(item: dict[str, Any]) -> RawBatch:
    """The item's batch (no pixels yet), or its sample error under ``on_error: raise``."""
    if "error" in item:
        index, path, reason = item["error"]
        raise SampleError(index, path, reason)
    return item["outcome"].raw_batch(None)
