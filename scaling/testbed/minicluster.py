"""A real multi-node Ray cluster on this machine: one Linux network namespace per node.

    scaling minicluster up --nodes 2 --bandwidth 1gbit
    scaling minicluster exec -- scaling sweep experiments/quickstart.yaml --workers 2 --out results/mc
    scaling minicluster status
    scaling minicluster preempt --node 1      # a spot preemption: link down, every process killed
    scaling minicluster rejoin --node 1       # the node back, as an autoscaler's replacement
    scaling minicluster down

Each node is a network namespace with its own IP on a private /24, joined to the host by a
veth pair whose host end sits on a Linux bridge; each node runs a real `ray start` (the head
in node 0). The node end of every veth is named `lab0` in every namespace, so
`GLOO_SOCKET_IFNAME=lab0` makes gloo bind to the node's own link wherever a worker runs.
`--bandwidth` caps what each node sends with a token bucket on its `lab0` (`tc ... tbf`:
netem is absent on these kernels), so traffic between any two nodes runs at most at the cap
in each direction, as between machines whose NICs run at that rate. A run can change the cap
for itself (`workers.link_bandwidth`, e.g. as a sweep axis): the driver, inside the cluster,
re-caps every node before the run (`set_bandwidth`); the summary records the cap in effect.

`up` records everything it makes (namespaces, links, bridge, caps, process ids) in a state
file under /run/scaling-minicluster/<name>/; `down` removes exactly that: it kills the
processes inside the recorded namespaces (`ip netns pids`), deletes the namespaces (which
deletes their veth pairs) and the bridge, never anything found by a broad name. Needs root
(CAP_NET_ADMIN, CAP_SYS_ADMIN); without it every subcommand says so in one line.

A script that builds a cluster for itself (the benchmarks in bench/) uses `running(...)`: up,
the block, then down, also when the script is ended by SIGTERM or SIGINT (`signals_raise`).

Commands run inside the cluster with `exec` (in the head's namespace, with RAY_ADDRESS set)
or from the host with `ray job submit --address http://<head ip>:<dashboard port>`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scaling.errors import UsageError
from scaling.results import write_json_atomic
from scaling.testbed.local_cluster import alive_nodes_at

STATE_ROOT = Path(os.environ.get("SCALING_MINICLUSTER_STATE", "/run/scaling-minicluster"))
NODE_IFACE = "lab0"  # the node end of each veth, the same name in every namespace (for GLOO_SOCKET_IFNAME)
GCS_PORT = 6390
DASHBOARD_PORT = 8270
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 300  # a node starting on a loaded 2-core machine (other test suites running) took over 120 s

# How fast the head declares a silent node dead. Ray's defaults (a check every 3 s, 10 s to answer,
# 5 misses in a row, after a 5 s grace) take about a minute; the minicluster's nodes share one
# host, so a check answers in milliseconds and a lost node is seen in seconds: every second, 2 s
# to answer, 3 misses (3-9 s). Ray reads them as RAY_<name> system-config variables (the GCS
# server's health checks of each raylet); a preemption test waits for that, not for a minute.
HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}


@dataclass
class Node:
    index: int
    namespace: str
    ip: str
    host_iface: str
    pid: int = 0  # the node's `ray start --block` process (its own process group)


@dataclass
class MiniCluster:
    name: str
    subnet: str
    bridge: str
    bridge_ip: str
    bandwidth: str | None  # tc rate, e.g. "1gbit"; None = uncapped
    cpus_per_node: int
    nodes: list[Node] = field(default_factory=list)
    # per node, the CPUs its processes are held to (`pin_cpus`), as processes of different machines
    # never share a core; an empty list (or none at all) = the kernel places them
    node_cpus: list[list[int]] = field(default_factory=list)
    head_cpus: int | None = None  # CPUs the head's Ray offers; None: cpus_per_node; 0: a head running no workers
    temp_dir: str = ""
    created_at: float = 0.0

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head.ip}:{DASHBOARD_PORT}"

    def env(self) -> dict:
        """The environment of processes that belong to the cluster (ray nodes, drivers)."""
        return {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",  # a private bridge no other machine reaches
            "RAY_USAGE_STATS_ENABLED": "0",
            **HEALTH_CHECK,
            # `down` stops each node with SIGTERM: without this, `ray start --block` waits out a
            # 30 s drain the GCS never answers (as the private head does: testbed/local_cluster.py)
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            "GLOO_SOCKET_IFNAME": NODE_IFACE,
            "SCALING_MINICLUSTER": self.name,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }


# --------------------------------------------------------------------------- helpers


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("the minicluster needs root (network namespaces, veth links and tc); run it as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise UsageError(f"the minicluster needs '{tool}' (Debian package iproute2)")


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _in_ns(namespace: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _sh("ip", "netns", "exec", namespace, *args, check=check)


def _state_path(name: str) -> Path:
    return STATE_ROOT / name / "state.json"


def _save(cluster: MiniCluster) -> None:
    write_json_atomic(_state_path(cluster.name), asdict(cluster))


def load(name: str = "lab") -> MiniCluster:
    path = _state_path(name)
    if not path.exists():
        raise UsageError(f"no minicluster named {name!r} is up (scaling minicluster up --nodes N)")
    data = json.loads(path.read_text())
    data["nodes"] = [Node(**node) for node in data["nodes"]]
    return MiniCluster(**data)


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z0-9]{1,6}", name):
        raise UsageError(f"minicluster name must be 1-6 lowercase letters or digits, got {name!r}")


TC_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit)$")


def rate_bits_per_s(rate: str) -> float:
    """tc's rate units (bits per second, SI prefixes): '100mbit' -> 1e8."""
    match = TC_RATE.match(rate.lower())
    if not match:
        raise UsageError(f"--bandwidth must be a tc rate such as 100mbit, 1gbit or 2.5gbit, got {rate!r}")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[match.group(2)]
    return float(rate[: -len(match.group(2))]) * scale


def tbf_burst_bytes(rate: str) -> int:
    """The token bucket's size for a cap: ~4 ms of traffic at the rate (at least 64 KB), enough for the
    kernel's timer granularity, small enough that bursts do not hide the rate. A message whose traffic
    fits in one burst leaves at the link's own speed, not the cap's (bench/projection_vs_minicluster.py)."""
    return max(64 * 1024, int(rate_bits_per_s(rate) / 8 * 0.004))


def _cap(run, iface: str, rate: str) -> None:
    """Token-bucket cap on `iface`'s egress (`tbf_burst_bytes` of burst)."""
    run(
        "tc",
        "qdisc",
        "replace",
        "dev",
        iface,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(tbf_burst_bytes(rate)),
        "latency",
        "200ms",
    )


def _wait_for_head(cluster: MiniCluster, head_process: subprocess.Popen) -> None:
    """Until the head's dashboard answers and its state API counts the head's own node alive (the GCS
    up, the raylet registered): HTTP requests, not `ray status` (a Python process importing Ray at each
    look, beside the starting head on a loaded 2-core machine: seconds of CPU per answer)."""
    deadline = time.time() + START_TIMEOUT_S
    while True:
        if _http_ok(f"{cluster.dashboard}/api/version") and alive_nodes(cluster) >= 1:
            return
        if head_process.poll() is not None or time.time() > deadline:
            raise RuntimeError(
                f"the head node did not start within {START_TIMEOUT_S:g} s "
                f"(exit {head_process.poll()}): its log is under {cluster.temp_dir}"
            )
        time.sleep(0.2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def alive_nodes(cluster: MiniCluster) -> int:
    """How many Ray nodes the head reports alive (0 when it cannot be asked): one request to its
    state API (`local_cluster.alive_nodes_at`), not a Python driver started in the head's namespace
    (importing Ray and registering a job took seconds per answer on a loaded 2-core machine, and
    `up`, `rejoin` and a preemption test poll this until the count they wait for)."""
    return alive_nodes_at(cluster.dashboard)


# --------------------------------------------------------------------------- up / down


def up(
    nodes: int,
    bandwidth: str | None = None,
    cpus_per_node: int = 1,
    name: str = "lab",
    subnet: str = "10.213.0.0/24",
    log=print,
    pin_cpus: bool = False,
    head_cpus: int | None = None,
) -> MiniCluster:
    """Build the cluster; on any failure, remove what was made so far and raise.

    `pin_cpus`: each node's Ray (and so every worker it starts) held to its own `cpus_per_node` CPUs
    of this machine; unpinned, a rank that wakes from a collective may resume on the core another
    node's rank just used. `head_cpus=0`: a head that offers no CPUs, so no worker runs there, as
    on a production cluster's dedicated head: the head's processes and each run's controller
    actors (Ray Train's) stay off the workers' nodes, and with `pin_cpus` the head is not pinned
    and its work spreads over every CPU rather than landing on one node's."""
    _require_root()
    _check_name(name)
    if nodes < 1 or nodes > 50:
        raise UsageError(f"--nodes must be between 1 and 50, got {nodes}")
    if head_cpus is not None and (head_cpus < 0 or (head_cpus == 0 and nodes < 2)):
        raise UsageError(f"--head-cpus must be >= 0, and 0 only with a node besides the head; got {head_cpus}")
    if bandwidth is not None:
        rate_bits_per_s(bandwidth)
    if _state_path(name).exists():
        raise UsageError(f"minicluster {name!r} is already up; 'scaling minicluster down --name {name}' first")
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    for route in _sh("ip", "-o", "route").stdout.splitlines():
        try:
            if ipaddress.ip_network(route.split()[0], strict=False).overlaps(net) and route.split()[0] != "default":
                raise UsageError(f"subnet {subnet} overlaps a route of this host ({route.split()[0]}); pass --subnet")
        except ValueError:
            continue
    cluster = MiniCluster(
        name=name,
        subnet=subnet,
        bridge=f"sm{name}br",
        bridge_ip=str(hosts[0]),
        bandwidth=bandwidth,
        cpus_per_node=cpus_per_node,
        temp_dir=f"/tmp/smc-{name}",
        created_at=time.time(),
        nodes=[Node(i, f"scaling-{name}-n{i}", str(hosts[9 + i]), f"sm{name}h{i}") for i in range(nodes)],
        head_cpus=head_cpus,
    )
    if pin_cpus:
        cluster.node_cpus = node_cpu_sets(nodes, cpus_per_node, pin_head=head_cpus != 0)
    _save(cluster)  # first: whatever happens next, `down` knows what to remove
    try:
        _build_network(cluster)
        _start_ray(cluster, log)
    except BaseException:
        try:
            down(name, log=lambda *_: None)
        except Exception as cleanup:  # said, and the cause raised: a failed cleanup must not stand in for it
            log(f"removing the half-built minicluster {name!r} failed too: {cleanup}")
        raise
    return cluster


def node_cpu_sets(nodes: int, cpus_per_node: int, pin_head: bool = True) -> list[list[int]]:
    """Each node's CPUs: the next `cpus_per_node` of this process's allowed CPUs, wrapping around;
    `pin_head` False: the head none (it runs no workers), the first worker node from the first CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    pinned = range(nodes) if pin_head else range(nodes - 1)
    sets = [[allowed[(i * cpus_per_node + k) % len(allowed)] for k in range(cpus_per_node)] for i in pinned]
    return sets if pin_head else [[], *sets]


def _node_affinity(cluster: MiniCluster, node: Node):
    """The `preexec_fn` that holds a node's `ray start` (and all it starts) to its CPUs; None unpinned."""
    if not cluster.node_cpus or not cluster.node_cpus[node.index]:
        return None
    cpus = set(cluster.node_cpus[node.index])
    return lambda: os.sched_setaffinity(0, cpus)


def _build_network(cluster: MiniCluster) -> None:
    prefix = ipaddress.ip_network(cluster.subnet).prefixlen
    _sh("ip", "link", "add", "name", cluster.bridge, "type", "bridge")
    _sh("ip", "addr", "add", f"{cluster.bridge_ip}/{prefix}", "dev", cluster.bridge)
    _sh("ip", "link", "set", cluster.bridge, "up")
    for node in cluster.nodes:
        _sh("ip", "netns", "add", node.namespace)
        _sh("ip", "link", "add", node.host_iface, "type", "veth", "peer", "name", f"{node.host_iface}p")
        _sh("ip", "link", "set", f"{node.host_iface}p", "netns", node.namespace)
        _in_ns(node.namespace, "ip", "link", "set", f"{node.host_iface}p", "name", NODE_IFACE)
        _in_ns(node.namespace, "ip", "addr", "add", f"{node.ip}/{prefix}", "dev", NODE_IFACE)
        _in_ns(node.namespace, "ip", "link", "set", NODE_IFACE, "up")
        _in_ns(node.namespace, "ip", "link", "set", "lo", "up")
        _in_ns(node.namespace, "ip", "route", "add", "default", "via", cluster.bridge_ip)
        _sh("ip", "link", "set", node.host_iface, "master", cluster.bridge)
        _sh("ip", "link", "set", node.host_iface, "up")
    _save(cluster)
    set_bandwidth(cluster.bandwidth, cluster.name)


def _start_ray(cluster: MiniCluster, log) -> None:
    env = cluster.env()
    common = _ray_start_options(cluster, cluster.head)
    head = cluster.head
    Path(cluster.temp_dir).mkdir(parents=True, exist_ok=True)
    log(f"starting the head in {head.namespace} ({head.ip})")
    process = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            head.namespace,
            str(BIN / "ray"),
            "start",
            "--head",
            f"--node-ip-address={head.ip}",
            f"--port={GCS_PORT}",
            "--dashboard-host=0.0.0.0",
            f"--dashboard-port={DASHBOARD_PORT}",
            f"--temp-dir={cluster.temp_dir}",
            *common,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_node_affinity(cluster, head),
    )
    head.pid = process.pid
    _save(cluster)
    _wait_for_head(cluster, process)
    starting = {}
    for node in cluster.nodes[1:]:
        log(f"starting node {node.index} in {node.namespace} ({node.ip})")
        starting[node.index] = _start_worker_node(cluster, node)
    _wait_for_nodes(cluster, len(cluster.nodes), starting, log)


def _ray_start_options(cluster: MiniCluster, node: Node) -> list[str]:
    cpus = cluster.head_cpus if node.index == 0 and cluster.head_cpus is not None else cluster.cpus_per_node
    return [f"--num-cpus={cpus}", "--num-gpus=0", "--disable-usage-stats", "--block"]


def _start_worker_node(cluster: MiniCluster, node: Node) -> subprocess.Popen:
    """`ray start` in a non-head node's namespace, joining the head; its process id recorded."""
    worker = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            node.namespace,
            str(BIN / "ray"),
            "start",
            f"--address={cluster.address}",
            f"--node-ip-address={node.ip}",
            *_ray_start_options(cluster, node),
        ],
        env=cluster.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_node_affinity(cluster, node),
    )
    node.pid = worker.pid
    _save(cluster)
    return worker


# A node's `ray start --block` exits when its raylet does, and a raylet gives up at its start when its dashboard agent
# (a Python process) has not written its port in time ("Timed out waiting for file .../metrics_agent_port_*", seen on
# a 2-core machine under load): such a node is started again, as an autoscaler retries a node, this many times in all.
NODE_START_ATTEMPTS = 3


def _wait_for_nodes(cluster: MiniCluster, count: int, starting: dict | None = None, log=None) -> None:
    """Until the head counts `count` nodes alive; `starting`: {node index: its `ray start`}, restarted if it exits."""
    deadline = time.time() + START_TIMEOUT_S
    starting = dict(starting or {})
    attempts = dict.fromkeys(starting, 1)
    while (alive := alive_nodes(cluster)) < count:
        for index, process in list(starting.items()):
            if process.poll() is None:
                continue
            node = cluster.nodes[index]
            if attempts[index] >= NODE_START_ATTEMPTS:
                raise RuntimeError(
                    f"node {index}'s Ray exited at its start {attempts[index]} times (last exit {process.returncode})"
                )
            attempts[index] += 1
            if log is not None:
                log(f"node {index}'s Ray exited at its start (exit {process.returncode}): starting it again")
            _kill(_namespace_pids(node.namespace), signal.SIGKILL)  # whatever of it is left
            _wait_until_empty([node.namespace], 10, 0.2)
            starting[index] = _start_worker_node(cluster, node)
        if time.time() > deadline:
            raise RuntimeError(f"only {alive} of {count} Ray nodes alive within {START_TIMEOUT_S} s")
        time.sleep(0.2)  # each look is one HTTP request (`alive_nodes`): look often, return when the node is in


# --------------------------------------------------------------------------- losing a node


def preempt(name: str, node_index: int) -> float:
    """Take a node away as a spot preemption does, not as a clean shutdown; returns when (unix time).

    Its link goes down first, so nothing it might still say (a raylet's goodbye, a closing
    connection) reaches the other nodes, then every process in its namespace (its raylet, its
    Ray workers, the training workers on it) is SIGKILLed. The rest of the cluster finds out
    the way it would on AWS: the head's health checks of that node go unanswered.
    The head (node 0) cannot be preempted: it holds the cluster's state (GCS), as an
    on-demand head does in the spot YAML (cluster/).
    """
    _require_root()
    cluster = load(name)
    if not 1 <= node_index < len(cluster.nodes):
        raise UsageError(f"--node must be a worker node, 1 to {len(cluster.nodes) - 1} (node 0 is the head)")
    node = cluster.nodes[node_index]
    lost_unix = time.time()
    _in_ns(node.namespace, "ip", "link", "set", NODE_IFACE, "down")
    _kill(_namespace_pids(node.namespace), signal.SIGKILL)
    _kill_group(node.pid, signal.SIGKILL)
    _wait_until_empty([node.namespace], 10, 0.2)  # SIGKILLed processes leave once the kernel reaped them
    node.pid = 0
    _save(cluster)
    return lost_unix


def rejoin(name: str, node_index: int) -> MiniCluster:
    """Bring a preempted node back (as the autoscaler's replacement would come): link up, Ray started,
    and wait until the head counts every node alive again."""
    _require_root()
    cluster = load(name)
    if not 1 <= node_index < len(cluster.nodes):
        raise UsageError(f"--node must be a worker node, 1 to {len(cluster.nodes) - 1} (node 0 is the head)")
    node = cluster.nodes[node_index]
    if node_running(cluster, node_index):
        raise UsageError(f"node {node_index} of minicluster {name!r} is running; 'minicluster preempt' it first")
    _in_ns(node.namespace, "ip", "link", "set", NODE_IFACE, "up")
    # the default route left with the link; the address stayed
    _in_ns(node.namespace, "ip", "route", "replace", "default", "via", cluster.bridge_ip)
    _wait_for_nodes(cluster, len(cluster.nodes), {node_index: _start_worker_node(cluster, node)})
    return cluster


def set_bandwidth(rate: str | None, name: str = "lab") -> MiniCluster:
    """Cap every node's egress at `rate` (a tc rate), or remove the caps (None / "uncapped")."""
    _require_root()
    rate = None if rate in (None, "", "uncapped") else rate
    if rate is not None:
        rate_bits_per_s(rate)
    cluster = load(name)
    for node in cluster.nodes:
        if rate is None:
            _in_ns(node.namespace, "tc", "qdisc", "del", "dev", NODE_IFACE, "root", check=False)
        else:
            _cap(lambda *a, ns=node.namespace: _in_ns(ns, *a), NODE_IFACE, rate)
    cluster.bandwidth = rate
    _save(cluster)
    return cluster


def current(env: dict | None = None) -> MiniCluster | None:
    """The minicluster this process runs inside (`exec` sets SCALING_MINICLUSTER), or None."""
    name = (env if env is not None else os.environ).get("SCALING_MINICLUSTER")
    if not name or not _state_path(name).exists():
        return None
    return load(name)


def _namespace_pids(namespace: str) -> list[int]:
    result = _sh("ip", "netns", "pids", namespace, check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _kill_group(pid: int, sig: int) -> None:
    """Signal the process group a node's `ray start` leads (0: none recorded)."""
    if pid:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass


def _wait_until_empty(namespaces: list[str], timeout_s: float, poll_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(_namespace_pids(ns) for ns in namespaces):
        time.sleep(poll_s)


def down(name: str = "lab", log=print) -> None:
    """Remove exactly what `up` recorded: processes in its namespaces, the namespaces, the bridge."""
    _require_root()
    cluster = load(name)
    existing = set(_sh("ip", "netns", "list", check=False).stdout.split())
    namespaces = [n.namespace for n in cluster.nodes if n.namespace in existing]
    # Ray nodes first, gently (workers before the head), then whatever is left in the namespaces.
    for node in reversed(cluster.nodes):
        _kill_group(node.pid, signal.SIGTERM)
    _wait_until_empty(namespaces, 20, 0.5)
    for ns in namespaces:
        _kill(_namespace_pids(ns), signal.SIGKILL)
    _wait_until_empty(namespaces, 10, 0.2)  # SIGKILLed processes leave once the kernel reaped them
    for node in cluster.nodes:
        _kill_group(node.pid, signal.SIGKILL)
    for ns in namespaces:
        _sh("ip", "netns", "del", ns, check=False)  # deletes the veth pair with it
    for node in cluster.nodes:
        _sh("ip", "link", "del", node.host_iface, check=False)  # a half-made pair, if up failed mid-way
    _sh("ip", "link", "del", cluster.bridge, check=False)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    _state_path(name).unlink()
    try:
        _state_path(name).parent.rmdir()
    except OSError:
        pass
    log(f"minicluster {name!r} removed ({len(cluster.nodes)} nodes)")


@contextlib.contextmanager
def signals_raise():
    """Within the block, SIGTERM raises SystemExit(143) and SIGINT KeyboardInterrupt, so that every
    `finally` (a teardown) runs as on a normal exit: Python's own SIGTERM ends the process at
    once. Yields the `shield` context manager: a signal that arrives inside it (a teardown in
    progress) is held until the shielded block is done, then raised. Off the main thread, where
    Python cannot set a handler, it does nothing."""
    state = {"shielded": 0, "held": None}

    def on_signal(signum, frame):
        if state["shielded"]:
            state["held"] = state["held"] or signum
            return
        _raise_for(signum)

    @contextlib.contextmanager
    def shield():
        state["shielded"] += 1
        try:
            yield
        finally:
            state["shielded"] -= 1
        if not state["shielded"] and state["held"] is not None:
            signum, state["held"] = state["held"], None
            _raise_for(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield shield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _raise_for(signum: int):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def running(
    nodes: int,
    bandwidth: str | None = None,
    cpus_per_node: int = 1,
    name: str = "lab",
    subnet: str = "10.213.0.0/24",
    log=print,
    pin_cpus: bool = False,
    head_cpus: int | None = None,
):
    """`up`, the block, then `down`, whichever way the block ends: returning, raising, or this
    process receiving SIGTERM or SIGINT (`signals_raise`); a signal during `down` waits for it."""
    with signals_raise() as shield:
        # `up` removes a half-built cluster itself
        cluster = up(nodes, bandwidth, cpus_per_node, name, subnet, log=log, pin_cpus=pin_cpus, head_cpus=head_cpus)
        try:
            yield cluster
        finally:
            with shield():
                down(name, log=log)


def status(name: str = "lab") -> dict:
    """Nodes, their IPs, processes and caps, as the kernel and Ray see them now."""
    _require_root()
    cluster = load(name)
    existing = set(_sh("ip", "netns", "list", check=False).stdout.split())
    rows = []
    for node in cluster.nodes:
        qdisc = (
            _in_ns(node.namespace, "tc", "qdisc", "show", "dev", NODE_IFACE, check=False).stdout.strip()
            if node.namespace in existing
            else ""
        )
        rate = re.search(r"rate (\S+)", qdisc)
        rows.append(
            {
                "node": node.index,
                "namespace": node.namespace,
                "ip": node.ip,
                "namespace_exists": node.namespace in existing,
                "ray_process_alive": _pid_alive(node.pid),
                "egress_cap": rate.group(1) if rate else "uncapped",
                "cpus": (cluster.node_cpus[node.index] if cluster.node_cpus else None) or "any",
            }
        )
    return {
        "name": cluster.name,
        "address": cluster.address,
        "dashboard": cluster.dashboard,
        "bandwidth": cluster.bandwidth,
        "head_cpus": cluster.cpus_per_node if cluster.head_cpus is None else cluster.head_cpus,
        "ray_nodes_alive": alive_nodes(cluster),
        "nodes": rows,
    }


def node_running(cluster: MiniCluster, node_index: int) -> bool:
    """Whether the node's `ray start` process is running (False once preempted)."""
    return _pid_alive(cluster.nodes[node_index].pid)


def _pid_alive(pid: int) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def exec_in(command: list[str], name: str = "lab", node: int = 0) -> int:
    """Run `command` in a node's namespace (the head's by default) as a driver of the cluster."""
    _require_root()
    cluster = load(name)
    if not command:
        raise UsageError("minicluster exec needs a command after --, e.g. -- scaling sweep CONFIG --workers 2")
    if not 0 <= node < len(cluster.nodes):
        raise UsageError(f"--node must be between 0 and {len(cluster.nodes) - 1}")
    env = {**cluster.env(), "RAY_ADDRESS": cluster.address}
    return subprocess.run(["ip", "netns", "exec", cluster.nodes[node].namespace, *command], env=env).returncode


class AllreduceProbe:
    """Ranks of scaling/testbed/allreduce_probe.py, one on each of `nodes` nodes from `first_node` on
    (1: past a head that runs no workers), alive across link-cap changes (`set_bandwidth`):
    `measure(sizes, iters)` times gloo all-reduces of each size between them. A context manager;
    `close()` ends the process group."""

    def __init__(self, name: str = "lab", nodes: int = 2, port: int | None = None, first_node: int = 0):
        from scaling.testbed.allreduce_probe import DEFAULT_PORT

        _require_root()
        cluster = load(name)
        if first_node < 0 or first_node + nodes > len(cluster.nodes):
            raise UsageError(
                f"the probe's {nodes} nodes from node {first_node} on: the cluster has {len(cluster.nodes)}"
            )
        env = cluster.env()
        self.processes = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.namespace,
                    sys.executable,
                    "-m",
                    "scaling.testbed.allreduce_probe",
                    f"--rank={node.index - first_node}",
                    f"--world={nodes}",
                    f"--master={cluster.nodes[first_node].ip}",
                    f"--port={port or DEFAULT_PORT}",
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if node.index == first_node else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_node_affinity(cluster, node),  # on its node's CPUs, as the node's workers
            )
            for node in cluster.nodes[first_node : first_node + nodes]
        ]
        if not self.processes[0].stdout.readline().strip():
            self.close()
            raise RuntimeError(f"all-reduce probe did not start: {self._error()}")

    def _error(self) -> str:
        return self.processes[0].stderr.read()[-400:].strip()

    def measure(
        self, sizes, iters: int = 3, collective: str = "all_reduce", interleaved: dict | None = None
    ) -> list[dict]:
        """Per size (bytes): {"bytes", "seconds": [...], "median_s", "mean_s"} of `collective`, all_reduce or
        all_gather; with `interleaved` ({"compute_s", "segments"}) the collective timed between
        compute, as a training step issues it (allreduce_probe.py `time_interleaved`)."""
        request = {"sizes": [int(s) for s in sizes], "iters": iters, "collective": collective}
        if interleaved:
            request["interleaved"] = interleaved
        line = json.dumps(request) + "\n"
        for process in self.processes:
            process.stdin.write(line)
            process.stdin.flush()
        answer = self.processes[0].stdout.readline()
        if not answer.strip():
            raise RuntimeError(f"all-reduce probe failed: {self._error()}")
        return json.loads(answer)["results"]

    def close(self) -> None:
        for process in self.processes:
            try:
                process.stdin.write("\n")
                process.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> "AllreduceProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def allreduce_seconds(nbytes: int, name: str = "lab", iters: int = 3, nodes: int = 2) -> dict:
    """Median time of a gloo all-reduce of `nbytes` across the first `nodes` nodes, one rank each:
    {"bytes", "seconds": [...], "median_s"}."""
    with AllreduceProbe(name, nodes) as probe:
        return probe.measure([nbytes], iters)[0]
