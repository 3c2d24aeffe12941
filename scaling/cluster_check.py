"""Offline checks of a Ray cluster-launcher YAML, before `ray up` spends money.

    scaling cluster check cluster/aws-p3.16xlarge.yaml

Two layers (the tests in tests/test_cluster_yamls.py hold both):
- Ray's own checks, the ones `ray up` runs before it talks to AWS: `prepare_config` (defaults
  merged, per-type min/max filled) and `validate_config` (ray-schema.json and Ray's rules).
- This project's checks, each returning its problems: worker resources match the instance
  table, shared storage is set in one place, nothing but SSH is open to the internet, the
  control plane is not exposed, the image is pinned, the node count covers 1..16-node sweeps,
  a spot worker type stands beside the on-demand one (the same node, spot market), and torch
  comes from a build with V100 (sm_70) kernels.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import ipaddress
import itertools
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]  # the repository (cluster/, uv.lock)
CLUSTER = ROOT / "cluster"

# The one table of instance types: AWS's GPU count and vCPU count for each.
INSTANCES = {
    "p3.2xlarge": (1, 8),
    "p3.8xlarge": (4, 32),
    "p3.16xlarge": (8, 64),
    "p3dn.24xlarge": (8, 96),
}
WORKER = "gpu_worker"  # the GPU node type's name in every file
SPOT_WORKER = "gpu_worker_spot"  # the same node on the spot market
SPOT_RESOURCE = (
    "spot_node"  # only the spot type has it: a request naming it launches spot nodes (cluster/request_nodes.py)
)
SHARED_MOUNT = "/mnt/efs"
MIN_NODES = 16  # sweeps go from 1 to 16 nodes

# Which PyTorch wheel indexes carry sm_70 (V100) kernels. PyTorch's RELEASE.md CUDA support matrix:
# CUDA 13.x builds start at Turing (7.5); from release 2.11 the CUDA 12.8 build does too
# (pytorch/pytorch#172352, #175253); CUDA 12.8 is gone from 2.12 on (#182849) and 2.13 ships
# CUDA 12.6 (with Volta) and 13.0 (#187075, #197555). PyPI's torch 2.13 is the CUDA 13.0 build,
# so an install without a cu12x index has no sm_70 either.
TORCH_INDEX = "https://download.pytorch.org/whl/"


def index_has_sm70(torch_version: str, index_url: str | None) -> bool:
    if not index_url or not index_url.startswith(TORCH_INDEX):
        return False  # PyPI (or anything else): CUDA 13 builds for torch >= 2.11
    m = re.fullmatch(r"cu(\d+)(\d)", index_url[len(TORCH_INDEX) :].strip("/"))
    if not m:
        return False  # cpu, rocm, ...
    cuda = (int(m.group(1)), int(m.group(2)))
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    if cuda >= (13, 0):
        return False
    if (major, minor) >= (2, 11):
        return cuda <= (12, 6)
    return cuda <= (12, 8)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())  # as ray up loads it


def ray_checks(config: dict) -> dict:
    """What `ray up` runs before contacting AWS; returns the prepared config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def project_pins() -> dict[str, str]:
    """Each package's version in the lab's lock file (uv.lock), its local label dropped (2.13.0+cpu: 2.13.0)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the lab extra brings tomli
        import tomli as tomllib

    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    return {p["name"]: p["version"].partition("+")[0] for p in packages if "version" in p}


def ray_default_inbound_rules() -> list[dict]:
    """The inbound rules Ray's AWS bootstrap gives a new security group besides the YAML's own,
    taken from Ray's source (the module itself needs boto3 at import, so its two pure rule
    builders are compiled out of it). The intra-cluster rule is built for a placeholder group id."""
    source = Path(importlib.util.find_spec("ray.autoscaler").submodule_search_locations[0])
    tree = ast.parse((source / "_private" / "aws" / "config.py").read_text())
    wanted = {"_create_default_intracluster_inbound_rules", "_create_default_ssh_inbound_rules"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {f.name for f in funcs} != wanted:
        raise RuntimeError("Ray's default security-group rules moved; re-check them")
    namespace: dict = {"itertools": itertools}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), "ray-aws-config", "exec"), namespace)
    return (
        namespace["_create_default_intracluster_inbound_rules"](["sg-self"])
        + namespace["_create_default_ssh_inbound_rules"]()
    )


# ---- project checks: each returns a list of problems ----------------------------------------


def resource_problems(config: dict, instance_type: str) -> list[str]:
    worker = config["available_node_types"][WORKER]
    actual = worker["node_config"].get("InstanceType")
    if actual != instance_type:
        return [f"worker InstanceType is {actual!r}, the file is for {instance_type}"]
    gpus, vcpus = INSTANCES[instance_type]
    res = worker.get("resources", {})
    problems = []
    if res.get("GPU") != gpus:
        problems.append(f"{instance_type} has {gpus} GPUs, resources say {res.get('GPU')}")
    if res.get("CPU") != vcpus:
        problems.append(f"{instance_type} has {vcpus} vCPUs, resources say {res.get('CPU')}")
    head = config["available_node_types"][config["head_node_type"]]
    if head.get("resources", {}).get("GPU"):
        problems.append("the head advertises GPUs")
    return problems


def _mount_commands(commands: list[str]) -> list[str]:
    return [c for c in commands if re.search(rf"mount -t nfs4 .* {re.escape(SHARED_MOUNT)}(;|\s|$)", c)]


def storage_problems(config: dict) -> list[str]:
    """Shared storage is set once (one setup command every node runs) and is a real EFS target."""
    problems = []
    mounts = _mount_commands(config.get("setup_commands", []))
    if len(mounts) != 1:
        problems.append(f"{len(mounts)} setup_commands mount {SHARED_MOUNT}; want exactly one")
    for key in ("head_setup_commands", "worker_setup_commands", "initialization_commands"):
        if _mount_commands(config.get(key, [])):
            problems.append(f"{key} mounts {SHARED_MOUNT} too: set shared storage in one place")
    for node_type in config["available_node_types"].values():
        if _mount_commands(node_type.get("worker_setup_commands", []) + node_type.get("initialization_commands", [])):
            problems.append("a node type mounts the shared storage itself")
    region = config["provider"]["region"]
    for cmd in mounts:
        if not re.search(rf"\bfs-[0-9A-Za-z_]+\.efs\.{re.escape(region)}\.amazonaws\.com:/ ", cmd):
            problems.append(f"the mount is not an EFS file system in {region}: {cmd}")
    return problems


def _open_to_world(perm: dict) -> bool:
    ranges = [r.get("CidrIp") for r in perm.get("IpRanges", [])] + [
        r.get("CidrIpv6") for r in perm.get("Ipv6Ranges", [])
    ]
    return any(r and ipaddress.ip_network(r, strict=False).prefixlen == 0 for r in ranges)


def ingress_problems(config: dict) -> list[str]:
    """Effective inbound rules (Ray's defaults + the YAML's IpPermissions): from anywhere, SSH only."""
    problems = []
    for name, node_type in config["available_node_types"].items():
        node_config = node_type.get("node_config", {})
        if "SecurityGroupIds" in node_config or any("Groups" in ni for ni in node_config.get("NetworkInterfaces", [])):
            problems.append(f"{name} sets its own security groups; the checked one would not apply")
    security_group = config["provider"].get("security_group")
    if not security_group or not security_group.get("GroupName"):
        problems.append("no provider.security_group.GroupName: Ray would use its shared default group")
        security_group = {}
    extra = security_group.get("IpPermissions", [])
    for perm in ray_default_inbound_rules() + extra:
        if not _open_to_world(perm):
            continue
        ssh_only = str(perm.get("IpProtocol")) == "tcp" and perm.get("FromPort") == 22 and perm.get("ToPort") == 22
        if not ssh_only:
            problems.append(
                f"open to the internet: protocol {perm.get('IpProtocol')} ports "
                f"{perm.get('FromPort')}-{perm.get('ToPort')}"
            )
    for perm in extra:
        for pair in perm.get("UserIdGroupPairs", []):
            if pair.get("GroupName") not in (None, security_group.get("GroupName")):
                problems.append(f"a rule admits another security group: {pair}")
    return problems


def control_plane_problems(config: dict) -> list[str]:
    """Dashboard/job API on loopback, token auth on every node, the token shipped to every node."""
    problems = []
    head_start = " ".join(config["head_start_ray_commands"])
    if "--dashboard-host=127.0.0.1" not in head_start:
        problems.append("the head's dashboard does not listen on loopback only")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        if not starts or not all("RAY_AUTH_MODE=token" in c for c in starts):
            problems.append(f"{key}: ray start without RAY_AUTH_MODE=token")
    if not any(remote.endswith("/.ray/auth_token") for remote in config.get("file_mounts", {})):
        problems.append("the auth token is not mounted on the nodes")
    return problems


def image_problems(config: dict) -> list[str]:
    problems = []
    for name, node_type in config["available_node_types"].items():
        image = str(node_type["node_config"].get("ImageId", ""))
        # empty / latest_dlami: Ray fills in its DEFAULT_AMI (a 2023 Ubuntu 18.04 image)
        if not re.fullmatch(r"ami-[0-9a-f]{8}(?:[0-9a-f]{9})?", image):
            problems.append(f"{name}: ImageId {image!r} is not a pinned AMI id")
    docker = config.get("docker") or {}
    for key in ("image", "head_image", "worker_image"):
        ref = docker.get(key)
        if ref and "@sha256:" not in ref and (":" not in ref.rsplit("/", 1)[-1] or ref.endswith(":latest")):
            problems.append(f"docker.{key} {ref!r} is not pinned")
    return problems


def size_problems(config: dict) -> list[str]:
    worker = config["available_node_types"][WORKER]
    problems = []
    if config.get("max_workers", 0) < MIN_NODES:
        problems.append(f"max_workers {config.get('max_workers')} < {MIN_NODES}")
    if worker.get("max_workers", config.get("max_workers", 0)) < MIN_NODES:
        problems.append(f"{WORKER}.max_workers {worker.get('max_workers')} < {MIN_NODES}")
    if worker.get("min_workers", 0) != 0:
        problems.append(f"{WORKER}.min_workers is {worker.get('min_workers')}: idle GPUs would be billed")
    return problems


def spot_problems(config: dict) -> list[str]:
    """A spot worker type beside the on-demand one: the same node (image, disk, placement, resources)
    on the spot market, told apart by one resource only it has; the on-demand type stays on demand."""
    types = config["available_node_types"]
    if SPOT_WORKER not in types:
        return [f"no '{SPOT_WORKER}' node type beside '{WORKER}'"]
    worker, spot = types[WORKER], types[SPOT_WORKER]
    problems = []
    market = (spot["node_config"].get("InstanceMarketOptions") or {}).get("MarketType")
    if market != "spot":
        problems.append(f"{SPOT_WORKER}: InstanceMarketOptions.MarketType is {market!r}, not 'spot'")
    if "InstanceMarketOptions" in worker["node_config"]:
        problems.append(f"{WORKER} sets InstanceMarketOptions: the on-demand type must stay on demand")
    same = {k: v for k, v in spot["node_config"].items() if k != "InstanceMarketOptions"}
    if same != worker["node_config"]:
        differing = sorted(
            k for k in set(same) | set(worker["node_config"]) if same.get(k) != worker["node_config"].get(k)
        )
        problems.append(f"{SPOT_WORKER} differs from {WORKER} in {', '.join(differing)}, not only in its market")
    if spot.get("resources") != {**worker.get("resources", {}), SPOT_RESOURCE: 1}:
        problems.append(
            f"{SPOT_WORKER} resources must be {WORKER}'s plus {{{SPOT_RESOURCE}: 1}}, got {spot.get('resources')}"
        )
    if SPOT_RESOURCE in worker.get("resources", {}):
        problems.append(f"{WORKER} advertises {SPOT_RESOURCE}: a spot request could land on demand")
    if spot.get("min_workers", 0) != 0:
        problems.append(f"{SPOT_WORKER}.min_workers is {spot.get('min_workers')}: idle GPUs would be billed")
    return problems


_TORCH_INSTALL = re.compile(r"\binstall\b.*\btorch==(?P<version>[^\s'\"]+)")


def torch_problems(config: dict) -> list[str]:
    """torch is installed, pinned to the project's version, from an index with sm_70 kernels, on
    every node, and the workers check the installed wheel's arch list."""
    problems = []
    want = project_pins()["torch"]
    for key in ("head_setup_commands", "worker_setup_commands"):
        installs = [c for c in config[key] if _TORCH_INSTALL.search(c)]
        if not installs:
            problems.append(f"{key}: torch is not installed")
        for cmd in installs:
            version = _TORCH_INSTALL.search(cmd).group("version")
            index = re.search(r"--index-url[= ](\S+)", cmd)
            index_url = index.group(1) if index else None
            if version != want:
                problems.append(f"{key}: torch=={version}, the project pins {want}")
            if "--extra-index-url" in cmd or not index_has_sm70(version, index_url):
                problems.append(f"{key}: torch {version} from {index_url or 'PyPI'} has no sm_70 (V100) kernels")
    if not any("sm_70" in c and "get_arch_list" in c for c in config["worker_setup_commands"]):
        problems.append("the workers do not check the installed torch for sm_70")
    return problems


def check_cluster_yaml(path: str | Path) -> list[str]:
    """Every problem of one cluster YAML (Ray's validator first), as one-line strings; [] = fine."""
    path = Path(path)
    if not path.is_file():
        return ["no such file"]
    try:
        raw = load(path)
    except yaml.YAMLError as exc:
        return [f"not valid YAML ({str(exc).splitlines()[0]})"]
    if not isinstance(raw, dict):
        return ["a cluster YAML is a mapping"]
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            config = ray_checks(raw)  # Ray's file-mount hints are not problems: keep them off the terminal
    except Exception as exc:  # jsonschema.ValidationError, ValueError, KeyError: Ray's validator refused it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [f"Ray's validator refuses it: {first}"]
    problems = storage_problems(raw)  # storage: the file as written (prepare_config merges setup commands)
    instance = config.get("available_node_types", {}).get(WORKER, {}).get("node_config", {}).get("InstanceType")
    if instance not in INSTANCES:
        problems.append(f"no '{WORKER}' node type with a known p3 InstanceType ({', '.join(INSTANCES)})")
    else:
        problems += resource_problems(config, instance)
    for check in (
        ingress_problems,
        control_plane_problems,
        image_problems,
        size_problems,
        spot_problems,
        torch_problems,
    ):
        try:
            problems += check(config)
        except (KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{check.__name__.removesuffix('_problems')}: missing or malformed section ({exc})")
    return problems
