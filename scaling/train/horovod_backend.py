"""Horovod as the lab's second communication backend (`backend: horovod`).

Ray Train 2.60 runs Train V2, which refuses `HorovodTrainer`. So the lab keeps one launcher:
Ray's `TorchTrainer` places the worker processes and sets up a torch.distributed (gloo) group
as for DDP; `setup_horovod_env_and_init` then does what Horovod's own launcher (`horovodrun
--gloo`, or V1's `HorovodConfig`) would: rank 0 starts Horovod's HTTP rendezvous server, the
address goes to every rank over the torch.distributed group, each rank sets the
`HOROVOD_*` environment (rank, size, local/cross rank, hostname, gloo interface, controller)
and calls `hvd.init()`, whose gloo contexts meet at that server.

Gradients: `wrap_optimizer` returns Horovod's `DistributedOptimizer`, which launches one
asynchronous all-reduce per parameter from a hook on its gradient accumulator during backward
(Horovod's background thread negotiates and fuses them, `HOROVOD_FUSION_THRESHOLD` bytes per
fusion buffer, every `HOROVOD_CYCLE_TIME` ms); `optimizer.synchronize()` waits for them.

Timing and the A/B overhead's no-sync pass are the instrument's (`HorovodBackend`,
`HorovodCommTimer` and `horovod_no_sync` in scaling/instrument/backends/horovod.py), as for any
user's Horovod job.

Horovod is imported lazily: this module imports without it (`available()` says why not).
Horovod 0.28.1 is built by `make horovod` (scripts/build_horovod.sh).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

from scaling.backend_choices import HorovodChoice

# Every variable this module sets; cleared before a new init so that nothing of an earlier
# configuration in the same process leaks into the next.
_PLACEMENT_KEYS = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_CONTROLLER",
    "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_GLOO_IFACE",
)
_TUNING_KEYS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_TIMELINE")


def available(use_gpu: bool = False) -> tuple[bool, str]:
    """(True, '') when horovod.torch imports and has gloo (and NCCL, for `use_gpu`); else
    (False, why not, one line).

    GPU workers need Horovod's NCCL operations: a build without them (a CPU build, which
    scripts/build_horovod.sh refuses to make silently where torch has CUDA) would not all-reduce
    GPU tensors with NCCL.
    """
    try:
        import horovod.torch as hvd
    except Exception as exc:  # ImportError, or an OSError from a library built against another torch
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return False, f"horovod.torch does not import ({first}); run `make horovod`"
    if not hvd.gloo_built():
        return False, "horovod was built without gloo; rebuild with `make horovod`"
    if use_gpu and not hvd.nccl_built():
        return False, (
            "horovod was built without NCCL, so GPU workers (workers.use_gpu) cannot use it; rebuild with "
            "`make horovod` where torch is a CUDA build and nvcc and NCCL are present, or use backend auto (DDP)"
        )
    return True, ""


def _hvd():
    import horovod.torch as hvd

    return hvd


@dataclass(frozen=True)
class HorovodTuning:
    """What Horovod reads from its environment at `hvd.init()` only (never after)."""

    fusion_threshold_bytes: int | None = None  # None: Horovod's default (128 MiB)
    cycle_time_ms: float | None = None  # None: Horovod's default (1 ms)
    timeline_path: str | None = None  # Chrome-trace JSON written by rank 0; absolute path

    @classmethod
    def from_mb(cls, fusion_threshold_mb: float | None, cycle_time_ms: float | None, timeline_path: str | None = None):
        threshold = None if fusion_threshold_mb is None else int(round(fusion_threshold_mb * 1024 * 1024))
        return cls(threshold, cycle_time_ms, timeline_path or None)

    def env(self) -> dict[str, str]:
        env = {}
        if self.fusion_threshold_bytes is not None:
            if self.fusion_threshold_bytes < 0:
                raise ValueError(f"fusion threshold must be >= 0 bytes, got {self.fusion_threshold_bytes}")
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_bytes))
        if self.cycle_time_ms is not None:
            if self.cycle_time_ms <= 0:
                raise ValueError(f"cycle time must be > 0 ms, got {self.cycle_time_ms}")
            env["HOROVOD_CYCLE_TIME"] = repr(float(self.cycle_time_ms))
        if self.timeline_path:
            if not os.path.isabs(self.timeline_path):
                raise ValueError(f"the timeline path must be absolute (Ray workers chdir), got {self.timeline_path!r}")
            env["HOROVOD_TIMELINE"] = self.timeline_path
        return env


@dataclass(frozen=True)
class HorovodRanks:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


class _State:
    server = None  # rank 0: horovod.runner.http.http_server.RendezvousServer
    tuning: HorovodTuning | None = None
    ranks: HorovodRanks | None = None


_state = _State()


# --- placement: pure functions (tested without horovod) -------------------------------------


def host_name(node_rank: int) -> str:
    """HOROVOD_HOSTNAME: one name per node. Horovod keys its local gloo context on it, so it
    must be equal on a node and differ across nodes; socket hostnames can be equal across
    network namespaces (tests/test_minicluster.py runs such nodes), Ray's node rank cannot."""
    return f"node{node_rank}"


def compute_ranks(placements: list[tuple[int, int]]) -> list[HorovodRanks]:
    """Horovod ranks of every process from [(node_rank, local_rank)] indexed by global rank.

    As horovod.ray's Coordinator does: local size = processes on the node; cross rank = the
    node's position among the nodes that have a process with this local rank; cross size =
    how many such nodes.
    """
    size = len(placements)
    local_sizes: dict[int, int] = {}
    for node, _ in placements:
        local_sizes[node] = local_sizes.get(node, 0) + 1
    nodes_by_local_rank: dict[int, list[int]] = {}
    for node, local in placements:
        nodes_by_local_rank.setdefault(local, []).append(node)
    ranks = []
    for rank, (node, local) in enumerate(placements):
        nodes = sorted(set(nodes_by_local_rank[local]))
        ranks.append(HorovodRanks(rank, size, local, local_sizes[node], nodes.index(node), len(nodes)))
    return ranks


def placement_env(
    ranks: HorovodRanks, hostname: str, rendezvous_addr: str, rendezvous_port: int, iface: str
) -> dict[str, str]:
    """The environment horovodrun --gloo (gloo_run.create_slot_env_vars + create_run_env_vars) sets."""
    return {
        "HOROVOD_RANK": str(ranks.rank),
        "HOROVOD_SIZE": str(ranks.size),
        "HOROVOD_LOCAL_RANK": str(ranks.local_rank),
        "HOROVOD_LOCAL_SIZE": str(ranks.local_size),
        "HOROVOD_CROSS_RANK": str(ranks.cross_rank),
        "HOROVOD_CROSS_SIZE": str(ranks.cross_size),
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
    }


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    return socket.gethostbyname(socket.gethostname())


def _iface_for_ip(ip: str) -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def choose_iface(num_nodes: int, iface: str | None = None) -> str:
    """The network interface Horovod's gloo binds: `iface`, else GLOO_SOCKET_IFNAME (the one
    torch's gloo is told to use), else loopback on one node, else the interface that carries
    this node's Ray IP."""
    if iface:
        return iface
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"].split(",")[0]
    if num_nodes <= 1:
        return "lo"
    ip = _node_ip()
    found = _iface_for_ip(ip)
    if found is None:
        raise RuntimeError(f"no network interface carries this node's IP {ip}; set GLOO_SOCKET_IFNAME")
    return found


# --- init / shutdown --------------------------------------------------------------------------


def setup_horovod_env_and_init(
    rank: int,
    world_size: int,
    local_rank: int,
    local_size: int | None,
    node_rank: int,
    num_nodes: int | None = None,
    iface: str | None = None,
    tuning: HorovodTuning | None = None,
    group=None,
) -> HorovodRanks:
    """Horovod on the processes of an initialised torch.distributed group (e.g. Ray Train's).

    Every rank of `group` must call this (it is collective). Rank 0 starts Horovod's gloo
    rendezvous server; its address goes to all ranks with `broadcast_object_list`, the
    placement of every rank with `all_gather_object`; each rank then sets the HOROVOD_*
    environment (placement and `tuning`: fusion threshold, cycle time, timeline, which Horovod
    reads at init only) and calls `hvd.init()`. Returns the Horovod ranks; they equal the
    torch.distributed ranks. `local_size=None` / `num_nodes=None`: counted from the ranks'
    node ranks (which must identify nodes: Ray Train's `get_node_rank()`, 0 for one machine).
    """
    import torch.distributed as dist

    hvd = _hvd()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("setup_horovod_env_and_init needs an initialised torch.distributed group")
    if dist.get_rank(group) != rank or dist.get_world_size(group) != world_size:
        raise ValueError(
            f"rank/world_size ({rank}/{world_size}) differ from torch.distributed's "
            f"({dist.get_rank(group)}/{dist.get_world_size(group)})"
        )
    if hvd.is_initialized():
        shutdown()

    placements: list = [None] * world_size
    dist.all_gather_object(placements, (node_rank, local_rank, local_size), group=group)
    nodes = {p[0] for p in placements}
    if num_nodes is None:
        num_nodes = len(nodes)
    elif len(nodes) != num_nodes:
        raise ValueError(f"num_nodes={num_nodes}, but the ranks report {len(nodes)} nodes ({sorted(nodes)})")
    all_ranks = compute_ranks([(n, lr) for n, lr, _ in placements])
    mine = all_ranks[rank]
    if local_size is not None and mine.local_size != local_size:
        raise ValueError(f"local_size={local_size}, but {mine.local_size} ranks report node {node_rank}")

    chosen_iface = choose_iface(num_nodes, iface)
    message: list = [None]
    if rank == 0:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        server = RendezvousServer(verbose=0)
        port = server.start()  # binds all interfaces, a free port
        # Scope sizes let the server clear each scope once all its ranks finished with it.
        server.init(
            [
                SlotInfo(
                    host_name(placements[r.rank][0]),
                    r.rank,
                    r.local_rank,
                    r.cross_rank,
                    r.size,
                    r.local_size,
                    r.cross_size,
                )
                for r in all_ranks
            ]
        )
        _state.server = server
        addr = "127.0.0.1" if num_nodes == 1 else _node_ip()
        message = [(addr, port)]
    dist.broadcast_object_list(message, src=0, group=group)
    addr, port = message[0]

    for key in _PLACEMENT_KEYS + _TUNING_KEYS:
        os.environ.pop(key, None)
    tuning = tuning or HorovodTuning()
    os.environ.update(placement_env(mine, host_name(node_rank), addr, port, chosen_iface))
    os.environ.update(tuning.env())
    hvd.init()
    got = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    want = (mine.rank, mine.size, mine.local_rank, mine.local_size, mine.cross_rank, mine.cross_size)
    if got != want:
        raise RuntimeError(f"horovod initialised as {got}, expected {want}")
    _state.tuning = tuning
    _state.ranks = mine
    return mine


def init(tuning: HorovodTuning | None = None) -> tuple[int, int, int, int]:
    """hvd.init() where the placement is already in the environment (horovodrun, or a second
    call); returns (rank, size, local_rank, cross_rank). Under Ray use setup_horovod_env_and_init."""
    hvd = _hvd()
    os.environ.update((tuning or HorovodTuning()).env())
    hvd.init()
    _state.tuning = tuning or HorovodTuning()
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank()


def shutdown() -> None:
    """hvd.shutdown() (rank 0 also closes the timeline file) and stop the rendezvous server."""
    hvd = _hvd()
    if hvd.is_initialized():
        hvd.shutdown()
    if _state.server is not None:
        try:
            _state.server.stop()
        except Exception:
            pass
        _state.server = None
    _state.ranks = None


# --- optimizer ---------------------------------------------------------------------------


def wrap_optimizer(
    optimizer,
    model,
    compression: str = "none",
    fusion_threshold_bytes: int | None = None,
    cycle_time_ms: float | None = None,
    backward_passes_per_step: int = 1,
):
    """Horovod's DistributedOptimizer over `optimizer`, rank 0's parameters everywhere.

    - Broadcasts `model.state_dict()` (parameters and buffers) from rank 0.
    - Broadcasts the optimizer state from rank 0 only when there is some (a resumed run).
      `hvd.broadcast_optimizer_state` on a fresh optimizer first runs a step with zero
      gradients to create the state; with weight decay that moves the parameters and fills
      the momentum buffers: the run would no longer start where DDP's starts. A fresh state is
      empty on every rank anyway.
    - `fusion_threshold_bytes` / `cycle_time_ms` are read by Horovod at init only: give them to
      `setup_horovod_env_and_init(tuning=...)`. Passed here they are checked against what init
      applied, and a mismatch raises instead of being silently ignored.

    Create the LR scheduler on the returned optimizer (it shares the param groups).
    Use `optimizer.zero_grad()`: Horovod's override takes no `set_to_none` (it sets to None).
    """
    hvd = _hvd()
    applied = _state.tuning or HorovodTuning()
    for name, wanted, have in (
        ("fusion_threshold_bytes", fusion_threshold_bytes, applied.fusion_threshold_bytes),
        ("cycle_time_ms", cycle_time_ms, applied.cycle_time_ms),
    ):
        if wanted is not None and wanted != have:
            raise ValueError(
                f"{name}={wanted} must be set before hvd.init() (init applied {have}); "
                "pass it in setup_horovod_env_and_init(tuning=HorovodTuning(...))"
            )
    if compression not in HorovodChoice.compressions:
        raise ValueError(f"horovod compression must be one of {HorovodChoice.compressions}, got {compression!r}")
    comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    had_state = len(optimizer.state_dict()["state"]) > 0
    dist_opt = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=comp,
        backward_passes_per_step=backward_passes_per_step,
    )
    if had_state:
        hvd.broadcast_optimizer_state(dist_opt, root_rank=0)
    return dist_opt


# --- timeline ----------------------------------------------------------------------------------


def _load_trace_events(path: str) -> list[dict]:
    """The events of a Horovod timeline. Horovod keeps the file a valid JSON array after every
    event (it writes `{...}]`, then seeks back over the `]` to append `,{...}]`); a file read
    while it is being written can still end inside an event: the complete ones are kept."""
    text = open(path).read()
    try:
        events = json.loads(text)
        if isinstance(events, list):
            return events
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    events, pos = [], text.find("[") + 1
    while pos > 0:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            event, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the last event, partly written
        events.append(event)
    return events


def parse_timeline(path, phase: str = "ALLREDUCE"):
    """Per-tensor phase intervals from a Horovod timeline (Chrome trace written by rank 0).

    Each tensor is a trace 'process' (metadata event `process_name` gives its name); its
    top-level phases are B/E pairs: NEGOTIATE_ALLREDUCE (waiting for every rank to submit it)
    then ALLREDUCE (the operation, with nested activities such as QUEUE,
    MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER). Returns a DataFrame
    with one row per `phase` interval: tensor, phase, start_s, end_s, duration_s (seconds since
    the timeline started, on Horovod's steady clock), sorted by start;
    `df.attrs["start_unix_s"]` is when it started (wall clock), to line it up with other
    records. `phase=None`: every interval at every depth, with a `depth` column.
    """
    import pandas as pd

    events = _load_trace_events(str(path))
    names: dict = {}
    start_unix_s = float("nan")
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args", {})
            if "start_time_since_epoch_in_micros" in args:
                start_unix_s = args["start_time_since_epoch_in_micros"] / 1e6
            else:
                names[e.get("pid")] = args.get("name", str(e.get("pid")))
    timed = [e for e in events if e.get("ph") in ("B", "E") and "ts" in e]
    stacks: dict = {}
    rows = []
    for e in timed:  # file order is time order per tensor
        key = (e.get("pid"), e.get("tid", 0))
        stack = stacks.setdefault(key, [])
        if e["ph"] == "B":
            stack.append(e)
        elif stack:
            begin = stack.pop()
            rows.append(
                {
                    "tensor": names.get(e.get("pid"), str(e.get("pid"))),
                    "phase": begin.get("name", ""),
                    "depth": len(stack),
                    "start_s": begin["ts"] / 1e6,
                    "end_s": e["ts"] / 1e6,
                }
            )
    df = pd.DataFrame(rows, columns=["tensor", "phase", "depth", "start_s", "end_s"])
    df["duration_s"] = df["end_s"] - df["start_s"]
    if phase is not None:
        df = df[(df["phase"] == phase) & (df["depth"] == 0)].drop(columns="depth")
    df = df.sort_values(["start_s", "tensor"]).reset_index(drop=True)
    df.attrs["start_unix_s"] = start_unix_s
    return df
