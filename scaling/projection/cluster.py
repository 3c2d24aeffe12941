"""Cluster presets and the per-device throughput table: YAML files read with yaml.safe_load,
validated (an unknown key or a bad value is refused with one line naming it).

    load_cluster("p3.16xlarge")            # a preset in scaling/projection/presets/
    load_cluster("path/to/my.yaml")        # your own, same keys

A cluster file:

    name: p3.16xlarge                      # optional (default: the file name)
    description: 8 V100 SXM2, NVLink ...   # optional
    device: V100 SXM2 16GB                 # a key of scaling/devices.yaml, or null (then give the
                                           #   compute time: --from-run or --samples-per-s)
    gpus_per_node: 8
    allreduce: ring                        # ring | hierarchical (scaling/projection/cost.py)
    intra_node:                            # required when gpus_per_node > 1
      name: NVLink 2 (hybrid cube-mesh)    # optional, free text
      bandwidth_GBps: 130                  # effective all-reduce bus bandwidth, 1e9 bytes/s ...
      latency_us: 2                        # per ring step
    inter_node:                            # required to span more than one node
      name: 25 Gbps Ethernet (ENA), TCP
      bandwidth_Gbps: 25                   # ... or in 1e9 bits/s (exactly one of the two)
      efficiency: 0.58                     # optional, default 1: the fraction of it NCCL gets
      latency_us: 40                       # per ring step that crosses this link
    collective_latency_us: 8.4             # optional, default 0: fixed cost of every all-reduce
    overlap_slowdown: 0.0                  # optional, default 0: backward compute runs at
                                           #   1/(1 + this) while an all-reduce is in flight
    step_jitter_cv: 0.02                   # optional, default 0: per-step compute time's
                                           #   coefficient of variation across ranks

The effective bandwidth used is bandwidth x efficiency (bytes/s): the transport's share of line
rate (TCP sockets get much less of it than RDMA). What each term does is in cost.py
(collective latency, interference) and compute.py (jitter: the wait for the slowest of n ranks).

The device table is the lab's one (scaling/devices.yaml, read by scaling/devices.py): per device
`memory_bandwidth_GBps` (for the optimizer step's time) and `throughput: {model: {precision:
{samples_per_s, batch, source}}}`, the published training throughput of one GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from scaling.devices import load_devices
from scaling.errors import UsageError
from scaling.projection.cost import ALGORITHMS, Link

PACKAGE_DIR = Path(__file__).resolve().parent
PRESET_DIR = PACKAGE_DIR / "presets"

CLUSTER_KEYS = (
    "name",
    "description",
    "device",
    "gpus_per_node",
    "allreduce",
    "intra_node",
    "inter_node",
    "collective_latency_us",
    "overlap_slowdown",
    "step_jitter_cv",
)
LINK_KEYS = ("name", "bandwidth_GBps", "bandwidth_Gbps", "efficiency", "latency_us")


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    intra_node: Link | None
    inter_node: Link | None
    allreduce: str = "ring"
    device: str | None = None
    description: str = ""
    source: str = ""  # the preset name or file it came from
    collective_latency_s: float = 0.0  # fixed cost of every all-reduce (cost.py)
    overlap_slowdown: float = 0.0  # backward compute slowdown while an all-reduce is in flight (cost.py)
    step_jitter_cv: float = 0.0  # coefficient of variation of a rank's step compute (compute.py)
    # the link an all-gather sees (its own fitted alpha and bus bandwidth, every hop), where all-gathers were
    # measured apart from all-reduces (nccl-tests reports each collective's); None: the all-reduce's links
    allgather_link: Link | None = None

    def with_algorithm(self, algorithm: str | None) -> "Cluster":
        if algorithm is None:
            return self
        if algorithm not in ALGORITHMS:
            raise UsageError(f"unknown all-reduce algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
        return replace(self, allreduce=algorithm)


def parse_int_list(text: str | Sequence[int], what: str) -> list[int]:
    """'1,2,4' or [1, 2, 4] -> [1, 2, 4]: positive integers, no repeats; UsageError otherwise."""
    if isinstance(text, str):
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise UsageError(f"{what} must be comma-separated positive integers, e.g. 1,2,4, got {text!r}") from None
    else:
        values = list(text)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise UsageError(f"{what} must be positive integers, got {values!r}")
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{what} must be positive integers, e.g. 1,2,4, got {text!r}")
    if len(set(values)) != len(values):
        raise UsageError(f"{what} repeats a value: {text!r}")
    return sorted(values)


def placements(
    cluster: Cluster, nodes: Sequence[int] | str | None, workers: Sequence[int] | str | None
) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) per row on `cluster`: the 1-GPU baseline first, then full nodes or given worker
    counts; UsageError for a count that fills no whole nodes, or more than one node without an inter-node link."""
    gpus_per_node = cluster.gpus_per_node
    points = {(1, 1)}
    if workers is not None:
        for w in parse_int_list(workers, "workers"):
            if w <= gpus_per_node:
                points.add((1, w))
            elif w % gpus_per_node == 0:
                points.add((w // gpus_per_node, gpus_per_node))
            else:
                raise UsageError(f"{w} workers do not fill whole nodes of {gpus_per_node} GPUs")
    if nodes is not None:
        for n in parse_int_list(nodes, "nodes"):
            points.add((n, gpus_per_node))
    if workers is None and nodes is None:
        raise UsageError("give the node counts (nodes) or worker counts (workers) to project")
    if any(n > 1 for n, _ in points) and cluster.inter_node is None:
        raise UsageError(f"cluster {cluster.name} has no inter_node link; it cannot span more than one node")
    return sorted(points, key=lambda p: (p[0] * p[1], p[0]))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _where(source: str, section: str | None) -> str:
    return f"cluster {source}" + (f", {section}" if section else "")


def _number(value, what: str, where: str, integer: bool = False, positive: bool = True) -> float:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or (positive and not value > 0) or (not positive and value < 0):
        kind = "a positive integer" if integer else ("a positive number" if positive else "a number >= 0")
        raise UsageError(f"{where}: {what} must be {kind}, got {value!r}")
    return value


def _check_keys(data, allowed: tuple[str, ...], where: str) -> dict:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(allowed)}")
    return data


def parse_link(data, where: str) -> Link:
    data = _check_keys(data, LINK_KEYS, where)
    has_bytes, has_bits = "bandwidth_GBps" in data, "bandwidth_Gbps" in data
    if has_bytes == has_bits:
        raise UsageError(f"{where}: give exactly one of bandwidth_GBps (1e9 bytes/s) or bandwidth_Gbps (1e9 bits/s)")
    if has_bytes:
        bandwidth = _number(data["bandwidth_GBps"], "bandwidth_GBps", where) * 1e9
    else:
        bandwidth = _number(data["bandwidth_Gbps"], "bandwidth_Gbps", where) * 1e9 / 8
    efficiency = _number(data.get("efficiency", 1.0), "efficiency", where)
    if efficiency > 1:
        raise UsageError(f"{where}: efficiency must be in (0, 1], got {efficiency!r}")
    if "latency_us" not in data:
        raise UsageError(f"{where}: latency_us is required")
    latency = _number(data["latency_us"], "latency_us", where, positive=False) * 1e-6
    name = data.get("name", "")
    return Link(bandwidth_bytes_per_s=bandwidth * efficiency, latency_s=latency, name=str(name))


def parse_cluster(data, source: str) -> Cluster:
    """A validated Cluster from a parsed YAML mapping; UsageError (one line) on anything wrong."""
    where = _where(source, None)
    data = _check_keys(data, CLUSTER_KEYS, where)
    if "gpus_per_node" not in data:
        raise UsageError(f"{where}: gpus_per_node is required")
    gpus = int(_number(data["gpus_per_node"], "gpus_per_node", where, integer=True))
    algorithm = data.get("allreduce", "ring")
    if algorithm not in ALGORITHMS:
        raise UsageError(f"{where}: allreduce must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    intra = parse_link(data["intra_node"], _where(source, "intra_node")) if data.get("intra_node") is not None else None
    if gpus > 1 and intra is None:
        raise UsageError(f"{where}: intra_node is required when gpus_per_node > 1")
    inter = parse_link(data["inter_node"], _where(source, "inter_node")) if data.get("inter_node") is not None else None
    device = data.get("device")
    if device is not None:
        devices = load_devices()
        if device not in devices:
            raise UsageError(f"{where}: unknown device {device!r}; known: {', '.join(sorted(devices))} (or null)")
    default_name = Path(source).stem if source.endswith((".yaml", ".yml")) else source
    terms = {
        key: _number(data.get(key, 0.0), key, where, positive=False)
        for key in ("collective_latency_us", "overlap_slowdown", "step_jitter_cv")
    }
    return Cluster(
        name=str(data.get("name") or default_name),
        gpus_per_node=gpus,
        intra_node=intra,
        inter_node=inter,
        allreduce=algorithm,
        device=device,
        description=str(data.get("description", "")),
        source=source,
        collective_latency_s=terms["collective_latency_us"] * 1e-6,
        overlap_slowdown=terms["overlap_slowdown"],
        step_jitter_cv=terms["step_jitter_cv"],
    )


def _read_yaml(path: Path, what: str):
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{what} {path} is not valid YAML{at}") from None


def load_cluster(name_or_path: str | Path) -> Cluster:
    """A preset by name (see `preset_names()`), or a cluster YAML file by path."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".yaml", ".yml")) or path.is_file() or "/" in text:
        if not path.is_file():
            raise UsageError(f"cluster file not found: {path}")
        return parse_cluster(_read_yaml(path, "cluster file"), str(path))
    preset = PRESET_DIR / f"{text}.yaml"
    if not preset.is_file():
        raise UsageError(f"unknown cluster {text!r}; presets: {', '.join(preset_names())} (or a path to a .yaml file)")
    return parse_cluster(_read_yaml(preset, "cluster preset"), text)


def cluster_from_alpha_beta(
    alpha_s: float,
    beta_bytes_per_s: float,
    gpus_per_node: int = 1,
    inter_alpha_s: float | None = None,
    inter_bytes_per_s: float | None = None,
    device: str | None = None,
    name: str = "fitted alpha-beta",
    allgather_alpha_s: float | None = None,
    allgather_bytes_per_s: float | None = None,
) -> Cluster:
    """A cluster whose links are fitted alpha (s) and bandwidth (bytes/s), e.g. from `fit_alpha_beta`.

    One (alpha, bandwidth) for every link unless the inter-node pair is given separately;
    flat ring all-reduce (what a ring fitted over all ranks measured). allgather_alpha_s and
    allgather_bytes_per_s: all-gathers fitted apart (`fit_alpha_beta(..., collective="all_gather")`),
    both or neither; by default an all-gather runs on the all-reduce's alpha and bandwidth.
    """
    where = "cluster_from_alpha_beta"
    _number(alpha_s, "alpha_s", where, positive=False)
    _number(beta_bytes_per_s, "beta_bytes_per_s (bandwidth, bytes/s)", where)
    _number(gpus_per_node, "gpus_per_node", where, integer=True)
    if inter_alpha_s is not None:
        _number(inter_alpha_s, "inter_alpha_s", where, positive=False)
    if inter_bytes_per_s is not None:
        _number(inter_bytes_per_s, "inter_bytes_per_s", where)
    if (allgather_alpha_s is None) != (allgather_bytes_per_s is None):
        raise UsageError(f"{where}: give allgather_alpha_s and allgather_bytes_per_s together, or neither")
    if allgather_bytes_per_s is not None:
        _number(allgather_alpha_s, "allgather_alpha_s", where, positive=False)
        _number(allgather_bytes_per_s, "allgather_bytes_per_s", where)
    intra = Link(float(beta_bytes_per_s), float(alpha_s), "fitted")
    inter = Link(
        float(inter_bytes_per_s or beta_bytes_per_s),
        float(alpha_s if inter_alpha_s is None else inter_alpha_s),
        "fitted",
    )
    return Cluster(
        name=name,
        gpus_per_node=int(gpus_per_node),
        intra_node=intra,
        inter_node=inter,
        allreduce="ring",
        device=device,
        source=name,
        allgather_link=(
            Link(float(allgather_bytes_per_s), float(allgather_alpha_s), "fitted all-gather")
            if allgather_bytes_per_s is not None
            else None
        ),
    )
