"""Trials on a Ray cluster (`--ray-address`): the job the local launcher runs, as a Ray task on a node it has to
itself, its result back to the driver, which owns the store.

- `check_address` at the edge (Ray itself retries an unreachable address for minutes), `connect` joins the cluster
  with the environment trials need; a cluster that refuses says why in one line (token authentication: where Ray
  looks for the token; a test cluster makes its own, never in ~/.ray).
- **Slots**: every alive node holds timing trials one at a time per device: a CPU node is one slot with all its
  CPUs, a GPU node one slot per `ranks` GPUs. A trial is pinned to its slot's node (node affinity, hard) and
  reserves the slot's CPUs and GPUs in Ray's own accounting, so no two timed trials share a device, whoever else
  submits work to the cluster.
- A task is a **fresh worker process** (`max_calls=1`: Ray reuses workers by default, warm caches and all) that
  starts the trial as a child of its own with the local launcher (timeouts, OOM and crash rows, the lifeline), and
  is **never retried by Ray** (`max_retries=0`): a node lost mid-trial is a row saying so, and the study goes on on
  the nodes left.
- **No shared disk**: the study's own files (its prepared data, a trained tokenizer) travel through Ray's object
  store (`pack` / `unpack`); results come back as return values. A local model directory must exist at the same
  path on every node (a preset or a hub id needs nothing).
- Each node says what it is (`Node.kind`: the CPU model and the CPUs a trial gets, or the GPU's name; the label
  `TRAINWISE_NODE_KIND` in a node's environment overrides it): rows are compared only with a baseline measured on
  the same kind (`study.aggregate`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import queue
import shutil
import socket
import tarfile
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from trainwise.core.env import device_kind
from trainwise.core.errors import ConfigError, RunFailed
from trainwise.run import launcher
from trainwise.run.worker import job_blob, job_of

# where Ray (2.52+) reads a cluster's token, first match wins; trainwise passes its environment through unchanged
TOKEN_SOURCES = "RAY_AUTH_TOKEN, the file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"
# what a trial on another node needs of the driver's environment (offline hub, caches)
PASSED = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRAINWISE_CACHE", "HF_HOME")
# a row's env and a spec's extra: the device kind it ran (a spec: must run) on; rows compare within a kind
KIND = "device_kind"


def ray_module(flag: str = "--ray-address"):
    try:
        import ray  # optional: trainwise[ray]
    except ImportError:
        raise ConfigError(f"{flag} needs Ray: pip install 'trainwise[ray]'") from None
    return ray


def check_address(address: str | None, flag: str = "--ray-address") -> None:
    """HOST:PORT, ray://HOST:PORT or auto, and something listening there: checked before anything runs."""
    if address is None:
        return
    ray_module(flag)
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{flag} {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ConfigError(f"{flag} {address}: cannot connect ({e.strerror or e})") from None


def connect_error(address: str | None, e: Exception) -> str:
    """One line for a cluster that ray.init could not join: a missing token says where Ray looks for one."""
    if type(e).__name__ == "AuthenticationError":
        return (
            f"--ray-address {address}: the cluster uses token authentication and no token was found here "
            f"(Ray reads {TOKEN_SOURCES}; copy the head node's token to one of them)"
        )
    text = " ".join(str(e).split())
    if address and "AuthenticationError" not in text:
        text += f"; a cluster with token authentication needs RAY_AUTH_MODE=token here and its token ({TOKEN_SOURCES})"
    return f"--ray-address {address}: cannot connect ({text})"


def connect(address: str | None, env: dict[str, str] | None = None) -> Any:
    """Join the cluster at `address` (None: a Ray of this process's own) with the driver's environment the trials
    need; ConfigError in one line when it refuses."""
    ray = ray_module()
    env_vars = {"TOKENIZERS_PARALLELISM": "false", **{k: os.environ[k] for k in PASSED if k in os.environ}}
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Ray Tune's console tables: trainwise says its own lines
    warnings.filterwarnings("ignore", message=".*reuse_actors.*")  # PBT's members restart by design
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": {**env_vars, **(env or {})}},
        )
    except Exception as e:  # Ray raises ConnectionError, RuntimeError or ValueError for a bad address
        raise ConfigError(connect_error(address, e)) from None
    return ray


# ---- the nodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    id: str  # Ray's node id
    ip: str
    cpus: int  # Ray's CPU resource on the node: the threads a timing trial there gets
    gpus: int
    host: str = ""
    kind: str = ""  # the device kind a trial there measures on

    def label(self) -> str:
        return f"{self.ip} ({self.kind})" if self.kind else self.ip


def _facts(device: str, cpus: int) -> dict:
    return {"host": socket.gethostname(), "kind": device_kind(device, cpus)}


def nodes(ray: Any, device: str, ranks: int = 1) -> list[Node]:
    """The cluster's alive nodes that can hold a trial (some CPU; for a CUDA study the GPUs of its ranks), each asked
    what it is."""
    found = []
    for n in ray.nodes():
        res = n.get("Resources", {})
        cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
        if n.get("Alive") and cpus > 0 and (device != "cuda" or gpus >= ranks):
            found.append(Node(n["NodeID"], n["NodeManagerAddress"], cpus, gpus))
    # a fresh worker (max_calls=1): a GPU node's probe leaves no CUDA context behind in a reused worker
    probe = ray.remote(num_cpus=0, max_retries=0, max_calls=1)(_facts)
    refs = [probe.options(scheduling_strategy=pinned(n.id)).remote(device, n.cpus) for n in found]
    out = []
    for n, ref in zip(found, refs, strict=True):
        try:
            f = ray.get(ref, timeout=300)
        except ray.exceptions.RayError:  # gone since the cluster listed it (its death not yet known there)
            continue
        out.append(Node(n.id, n.ip, n.cpus, n.gpus, f["host"], f["kind"]))
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def remote_port(ray: Any, node: Node) -> Any:
    """A free port on `node` (a group's rendezvous there), asked of the node itself."""
    probe = ray.remote(num_cpus=0, max_retries=0)(_port)
    return probe.options(scheduling_strategy=pinned(node.id)).remote()


def pinned(node_id: str, soft: bool = False) -> Any:
    """A task's or an actor's placement on one node (hard: it runs there or not at all)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional: trainwise[ray]

    return NodeAffinitySchedulingStrategy(node_id, soft=soft)


def alive(ray: Any) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


# ---- the study's files, through the object store ---------------------------------------------------


def pack(dirs: dict[str, str | None]) -> bytes:
    """The named directories (None: absent) as one gzipped tar, each under its name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, path in sorted(dirs.items()):
            if path is not None:
                tar.add(path, arcname=name)
    return buf.getvalue()


def unpack(blob: bytes) -> Path:
    """`pack`'s directories under a folder of this user's on this node, named by their content (trials of one study
    on one node unpack once); returns that folder."""
    root = Path(tempfile.gettempdir()) / f"trainwise-ray-{os.getuid()}" / hashlib.sha256(blob).hexdigest()[:16]
    done = root / ".unpacked"
    if not done.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent))
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        (staging / ".unpacked").touch()
        try:
            staging.rename(root)
        except OSError:  # another trial on this node unpacked it first: theirs stands
            shutil.rmtree(staging, ignore_errors=True)
    return root


def on_this_node(spec: Any, root: Path) -> Any:
    """A trial spec with the study's files where `unpack` put them on this node."""

    s = spec.settings
    here = dataclasses.replace(
        s, data_dir=str(root / "data"), tokenizer_dir=str(root / "tokenizer") if s.tokenizer_dir else None
    )
    return dataclasses.replace(spec, settings=here)


def study_files(ray: Any, spec: Any) -> Any:
    """The study's own files (its prepared data, a trained tokenizer) in the cluster's object store."""
    s = spec.settings
    return ray.put(pack({"data": s.data_dir, "tokenizer": s.tokenizer_dir}))


# ---- the dispatcher ---------------------------------------------------------------------------------

T = TypeVar("T")


@dataclass(frozen=True)
class Slot:
    node: Node
    index: int  # the slot's number on its node: a GPU node's slots are told apart by it
    gpus: int
    peers: tuple[Node, ...] = ()  # a trial spanning nodes: the others (node 0 of its rendezvous is `node`)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return (self.node, *self.peers)


@dataclass(frozen=True)
class Lost:
    """A trial that came back without a result: its node left the cluster, its worker died, Ray's memory monitor
    killed it, or the task raised."""

    status: str  # "crashed" | "oom" | "error"
    message: str


class Pool:
    """Runs items as Ray tasks over the cluster's slots, as many at once as there are slots, and hands each
    outcome to the caller as it arrives (in the caller's thread: the driver stores it)."""

    def __init__(self, address: str | None, device: str, ranks: int = 1, span: int = 1):
        self.ray = connect(address)
        self.device, self.ranks = device, ranks
        self.nodes = nodes(self.ray, device, ranks)
        if not self.nodes:
            need = f"{ranks} GPU(s)" if device == "cuda" else "a CPU"
            self.close()
            raise ConfigError(f"--ray-address {address}: no node of the cluster has {need} for a trial")
        gpus = ranks if device == "cuda" else 0
        if span == 1:
            self.slots = [
                Slot(n, i, gpus) for n in self.nodes for i in range(max(1, n.gpus // ranks) if device == "cuda" else 1)
            ]
        else:  # a trial spans `span` nodes of one kind: the nodes of each kind in groups (those left over idle)
            self.slots = []
            for kind in self.kinds():
                same = [n for n in self.nodes if n.kind == kind]
                self.slots += [Slot(g[0], 0, gpus, tuple(g[1:])) for g in zip(*[iter(same)] * span, strict=False)]
            if not self.slots:
                self.close()
                raise ConfigError(
                    f"--nodes-per-trial {span}: the cluster has no {span} nodes of one device kind "
                    f"({len(self.nodes)} node(s): {', '.join(self.kinds())})"
                )
        self._lock = threading.Lock()
        self._free: queue.Queue[Slot] | None = None  # `call`'s slots, made at its first use
        self._live = list(self.slots)  # `call`'s slots whose node is still there
        self._stopping = threading.Event()
        self._task: Any = None
        self._channel: Any = None

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(n.kind for n in self.nodes))

    def run(
        self,
        items: Iterable[T],
        task: Callable[..., Any],
        args: Callable[[T, Slot, dict | None], tuple],
        on_start: Callable[[T, Slot], None],
        on_end: Callable[[T, Slot, Any], None],
        kind_of: Callable[[T], str | None] = lambda _item: None,
        failed: Callable[[Any], bool] = lambda _value: False,
    ) -> list[T]:
        """Run `task(*args(item, slot, rendezvous))` for every item on a free slot (of the item's kind when
        `kind_of` names one): one task, or for a slot spanning nodes one per node, each with its place in the
        group's rendezvous (None for one node); `on_end(item, slot, value or Lost)` as each ends. A group gives the
        list of its nodes' values, or its first failure as it came (a Lost, or a value `failed` says is one, as
        {"part": its node's place, **value}): the others' parts are cancelled then. Returns the items no slot
        could take (every node of their kind gone)."""
        ray = self.ray
        remote = ray.remote(max_calls=1, max_retries=0)(task)
        waiting, free = list(items), list(self.slots)
        running: dict[Any, tuple[int, int]] = {}  # a task -> (its group, its node's place in it)
        groups: dict[int, dict] = {}
        stranded: list[T] = []
        try:
            while waiting or running:
                for item in list(waiting):
                    want = kind_of(item)
                    slot = next((s for s in free if want is None or s.node.kind == want), None)
                    if slot is None:
                        if not any(want is None or s.node.kind == want for s in self.slots):
                            waiting.remove(item)
                            stranded.append(item)
                        continue
                    free.remove(slot)
                    waiting.remove(item)
                    span = len(slot.nodes)
                    try:
                        port = ray.get(remote_port(ray, slot.node)) if span > 1 else 0
                    except ray.exceptions.RayError:  # its first node went meanwhile: the slot goes, the item waits
                        self.slots = [s for s in self.slots if s is not slot]
                        waiting.insert(0, item)
                        continue
                    gid = len(groups)
                    groups[gid] = {"item": item, "slot": slot, "values": [None] * span, "left": span, "gone": False}
                    groups[gid] |= {"cause": None, "requeue": False}
                    for rank, node in enumerate(slot.nodes):
                        meet = {"nnodes": span, "node_rank": rank, "addr": slot.node.ip, "port": port}
                        ref = remote.options(**self._holding(node, slot)).remote(
                            *args(item, slot, meet if span > 1 else None)
                        )
                        running[ref] = (gid, rank)
                    on_start(item, slot)
                if not running:
                    continue
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in done:
                    gid, rank = running.pop(ref)
                    g = groups[gid]
                    node = g["slot"].nodes[rank]
                    value, gone = self._outcome(ref, node)
                    g["values"][rank], g["left"] = value, g["left"] - 1
                    if gone:  # the node left: its slots leave with it
                        g["gone"] = True
                        self.slots = [s for s in self.slots if node not in s.nodes]
                        free = [s for s in free if node not in s.nodes]
                    bad = value is None or isinstance(value, Lost) or (len(g["slot"].nodes) > 1 and failed(value))
                    if bad and g["cause"] is None and not g["requeue"]:  # the first failure is the group's cause
                        if value is None:
                            g["requeue"] = True  # never started: placed again once its parts have ended
                        else:
                            g["cause"] = value if isinstance(value, Lost) else {"part": rank, **value}
                        for other, (o_gid, _) in list(running.items()):  # the others' parts would wait for it
                            if o_gid == gid:
                                with contextlib.suppress(Exception):
                                    ray.cancel(other, force=True)
                    if g["left"]:
                        continue
                    item, slot, values = g["item"], g["slot"], g["values"]
                    if not g["gone"]:
                        free.append(slot)
                    if g["cause"] is not None:
                        on_end(item, slot, g["cause"])
                    elif g["requeue"]:
                        waiting.insert(0, item)
                    else:
                        on_end(item, slot, values if len(values) > 1 else values[0])
        except BaseException:
            for ref in running:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
        return stranded

    def _holding(self, node: Node, slot: Slot) -> dict:
        """A trial's task options: on `node`, holding what the slot measures with (all the node's CPUs, or its GPUs)."""
        cpus = node.cpus if self.device != "cuda" else 1
        return {"num_cpus": cpus, "num_gpus": slot.gpus, "scheduling_strategy": pinned(node.id)}

    def _outcome(self, ref: Any, node: Node) -> tuple[Any, bool]:
        """(the task's value, a Lost, or None for a task that never started; whether its node is gone)."""
        ex = self.ray.exceptions
        try:
            return self.ray.get(ref), False
        except ex.TaskUnschedulableError:
            return None, True
        except ex.TaskCancelledError:  # another node of its group failed first: that one says why
            return Lost("crashed", f"cancelled on node {node.ip}: another node of the trial failed"), False
        except ex.OutOfMemoryError as e:
            return Lost("oom", f"killed by Ray's memory monitor on node {node.ip}: {_first(e)}"), False
        except ex.RayTaskError as e:  # the task itself raised (not the trial: that is a row it returns)
            return Lost("error", f"on node {node.ip}: {_first(e)}"), False
        except ex.RayError as e:  # the worker or its node died
            gone = isinstance(e, ex.NodeDiedError)
            if not gone:
                time.sleep(0.5)
                gone = node.id not in alive(self.ray)
            where = f"node {node.label()} left the cluster" if gone else f"its worker on node {node.ip} died"
            return Lost("crashed", f"{where} during the trial ({type(e).__name__}: {_sentence(e)})"), gone

    def call(
        self,
        job: Any,
        files: Any,
        on_event: Callable[[Any], bool | None],
        timeout_s: float | None,
        on_start: Callable[[Slot], None] = lambda _slot: None,
    ) -> Any:
        """Run one launcher job (its class has `on_node(root)`: the job with the study's files unpacked at root)
        on a free slot, in a fresh worker, as the launcher runs it locally; its events come back to `on_event` as
        they happen (True from it stops the job, as locally). Blocks; several threads may call at once, each
        holding a slot. Returns the job's result, or a Lost. RunFailed when no node is left, or once `stop()` was
        called (the job, running or not, is cancelled)."""
        ray = self.ray
        with self._lock:
            if self._free is None:
                self._free = queue.Queue()
                for slot in self.slots:
                    self._free.put(slot)
                self._task = ray.remote(max_calls=1, max_retries=0)(run_job)
                # beside the driver: its node outlives any trial's (soft: a driver outside the cluster is no node)
                here = pinned(ray.get_runtime_context().get_node_id(), soft=True)
                self._channel = ray.remote(num_cpus=0, scheduling_strategy=here)(Channel)
        while True:  # a job whose node was gone before it started is placed again, on another slot
            slot = self._take()
            gone, ref, channel, value = False, None, None, None
            try:
                channel = self._channel.remote()
                ref = self._task.options(**self._holding(slot.node, slot)).remote(
                    job_blob(job), files, channel, timeout_s
                )
                on_start(slot)
                halted = False
                while not self._stopping.is_set():
                    done, _ = ray.wait([ref], timeout=0.5)
                    try:
                        events = ray.get(channel.take.remote())
                    except ray.exceptions.RayActorError:  # the channel's node went (a driver outside the cluster)
                        events = []
                    for event in events:
                        if on_event(event) is True and not halted:
                            halted = True
                            channel.halt.remote()
                    if done:
                        value, gone = self._outcome(ref, slot.node)
                        ref = None
                        break
                else:
                    raise RunFailed("stopped")
            finally:
                if ref is not None:  # not ended: stopped, or an exception here
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)
                if channel is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(channel)
                self._give_back(slot, gone)
            if value is not None:
                return value

    def _take(self) -> Slot:
        """A free slot of `call`'s, waiting for one; RunFailed when no node is left or the pool is stopping."""
        assert self._free is not None
        while True:
            if self._stopping.is_set():
                raise RunFailed("stopped")
            with self._lock:
                if not self._live:
                    raise RunFailed(
                        "no node of the cluster is left to run a trial; run the same command again when it has "
                        "nodes: the finished trials are kept"
                    )
            with contextlib.suppress(queue.Empty):
                slot = self._free.get(timeout=0.5)
                with self._lock:
                    if slot in self._live:  # not a slot of a node gone meanwhile
                        return slot

    def _give_back(self, slot: Slot, gone: bool) -> None:
        assert self._free is not None
        with self._lock:
            if gone:  # the node left: its slots leave with it
                self._live = [s for s in self._live if s.node.id != slot.node.id]
            elif slot in self._live:
                self._free.put(slot)

    def stop(self) -> None:
        """Every `call` waiting or running ends (its job cancelled) with RunFailed('stopped')."""
        self._stopping.set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()


class Channel:
    """A job's events from its node to the driver, and the driver's word to stop it (a Ray actor, no CPU)."""

    def __init__(self) -> None:
        self.events: list = []
        self.stop = False

    def put(self, event: Any) -> bool:
        self.events.append(event)
        return self.stop

    def take(self) -> list:
        out, self.events = self.events, []
        return out

    def halt(self) -> None:
        self.stop = True


def settle(files: bytes, ranks: int = 1) -> Path:
    """On a node, in a fresh Ray worker, before a job: its children exec'd (one job per worker: a zygote would be a
    second start), each of its `ranks` with its share of the CPUs Ray gave the task as threads, and the study's
    files unpacked here; returns where (`unpack`)."""
    ray = ray_module()
    threads = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads // ranks))
    os.environ["TRAINWISE_FORK"] = "0"
    return unpack(files)


def run_job(blob: dict, files: bytes, channel: Any, timeout_s: float | None) -> Any:
    """On a node, in a fresh Ray worker: the job rebuilt, moved onto this node's copy of the study's files, and run
    by the local launcher as a child of this worker (exec'd), with the CPUs Ray gave it as its threads; each event
    goes to the driver, whose word to stop comes back with the next."""
    ray = ray_module()
    job = job_of(blob).on_node(settle(files))

    def on_event(event: Any) -> bool:
        return bool(ray.get(channel.put.remote(event)))

    return launcher.run(job, on_event, backend="exec", timeout_s=timeout_s)


def _sentence(e: BaseException) -> str:
    """The first sentence of Ray's message (the rest is advice on Ray's own tools)."""
    text = " ".join(str(e).split())
    return (text.split(". ")[0] if text else type(e).__name__)[:300]


def _first(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]
