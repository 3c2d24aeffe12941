"""The Ray cluster-launcher YAMLs in cluster/, checked offline.

Two layers:
- Ray's own checks, the ones `ray up` runs before it talks to AWS: `create_or_update_cluster`
  (ray/autoscaler/_private/commands.py) loads the file with yaml.safe_load, then
  `_bootstrap_config` calls `prepare_config` (defaults merged, setup commands merged, per-type
  min/max filled) and `validate_config` (ray-schema.json + its own rules). What `ray up` does
  between those two (the AWS provider's resource autodetection) and after them (the provider's
  bootstrap_config: IAM, key pair, subnets, security group) needs boto3 and credentials, so it is
  not run here; the resources are written out in the YAMLs, so nothing needs detecting.
- This project's checks: worker resources match the instance table, shared storage is set in one
  place, nothing but SSH is open to the internet, the image is pinned, the node count covers
  1..16-node sweeps, and torch comes from a build with V100 (sm_70) kernels.
Each project check returns its problems, so the negative tests can show that it fails.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import ipaddress
import itertools
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"

# The one table of instance types: AWS's GPU count and vCPU count for each.
INSTANCES = {
    "p3.2xlarge": (1, 8),
    "p3.8xlarge": (4, 32),
    "p3.16xlarge": (8, 64),
    "p3dn.24xlarge": (8, 96),
}
WORKER = "gpu_worker"  # the GPU node type's name in every file
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
    m = re.fullmatch(r"cu(\d+)(\d)", index_url[len(TORCH_INDEX):].strip("/"))
    if not m:
        return False  # cpu, rocm, ...
    cuda = (int(m.group(1)), int(m.group(2)))
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    if cuda >= (13, 0):
        return False
    if (major, minor) >= (2, 11):
        return cuda <= (12, 6)
    return cuda <= (12, 8)


def yaml_paths() -> list[Path]:
    return sorted(CLUSTER.glob("aws-*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())  # as ray up loads it


def ray_checks(config: dict) -> dict:
    """What `ray up` runs before contacting AWS; returns the prepared config."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def project_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, _, version = dep.partition("==")
        pins[re.sub(r"\[.*\]", "", name).strip()] = version.strip()
    return pins


def ray_default_inbound_rules() -> list[dict]:
    """The inbound rules Ray's AWS bootstrap gives a new security group besides the YAML's own,
    taken from Ray's source (the module itself needs boto3 at import, so its two pure rule
    builders are compiled out of it). The intra-cluster rule is built for a placeholder group id."""
    source = Path(importlib.util.find_spec("ray.autoscaler").submodule_search_locations[0])
    tree = ast.parse((source / "_private" / "aws" / "config.py").read_text())
    wanted = {"_create_default_intracluster_inbound_rules", "_create_default_ssh_inbound_rules"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in funcs} == wanted, "Ray's default security-group rules moved; re-check them"
    namespace: dict = {"itertools": itertools}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), "ray-aws-config", "exec"), namespace)
    return namespace["_create_default_intracluster_inbound_rules"](["sg-self"]) + namespace[
        "_create_default_ssh_inbound_rules"
    ]()


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
    ranges = [r.get("CidrIp") for r in perm.get("IpRanges", [])] + [r.get("CidrIpv6") for r in perm.get("Ipv6Ranges", [])]
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
                f"open to the internet: protocol {perm.get('IpProtocol')} ports {perm.get('FromPort')}-{perm.get('ToPort')}"
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


# ---- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[p.name for p in yaml_paths()])
def cluster_yaml(request) -> tuple[str, dict, dict]:
    path = CLUSTER / request.param
    raw = load(path)
    return re.fullmatch(r"aws-(.+)\.yaml", path.name).group(1), raw, ray_checks(raw)


def test_one_yaml_per_instance_type():
    assert {p.name for p in yaml_paths()} == {f"aws-{t}.yaml" for t in INSTANCES}


def test_ray_validator_accepts(cluster_yaml):
    _, raw, prepared = cluster_yaml
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]
    # defaults are merged per top-level key: every command list must be the YAML's own, or Ray's
    # defaults (a ray nightly wheel, a dashboard on 0.0.0.0) would come in
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in raw, key


def test_worker_resources_match_instance(cluster_yaml):
    instance_type, _, prepared = cluster_yaml
    assert resource_problems(prepared, instance_type) == []


def test_shared_storage_set_once_and_on_every_node(cluster_yaml):
    _, raw, prepared = cluster_yaml
    assert storage_problems(raw) == []
    # prepare_config prepends setup_commands to both node roles' commands
    (mount,) = _mount_commands(raw["setup_commands"])
    assert mount in prepared["head_setup_commands"] and mount in prepared["worker_setup_commands"]
    # the ImageNet config reads from the same storage
    experiment = yaml.safe_load((ROOT / "experiments" / "resnet50-imagenet-p3.yaml").read_text())
    assert experiment["data"]["path"].startswith(SHARED_MOUNT + "/")


def test_only_ssh_open_to_the_internet(cluster_yaml):
    _, _, prepared = cluster_yaml
    assert ingress_problems(prepared) == []
    assert control_plane_problems(prepared) == []


def test_image_pinned(cluster_yaml):
    _, _, prepared = cluster_yaml
    assert image_problems(prepared) == []


def test_sized_for_sweeps_and_placement_group(cluster_yaml):
    _, _, prepared = cluster_yaml
    assert size_problems(prepared) == []
    assert prepared["available_node_types"][WORKER]["node_config"]["Placement"]["GroupName"]
    # a cluster placement group lives in one zone
    assert "," not in prepared["provider"]["availability_zone"]


def test_torch_build_runs_on_v100(cluster_yaml):
    _, _, prepared = cluster_yaml
    assert torch_problems(prepared) == []


def test_yamls_differ_only_where_the_instance_does():
    def normalized(raw: dict) -> dict:
        raw = copy.deepcopy(raw)
        raw.pop("cluster_name")
        worker = raw["available_node_types"][WORKER]
        worker["resources"] = worker["node_config"]["InstanceType"] = None
        return raw

    first, *rest = [load(p) for p in yaml_paths()]
    for other in rest:
        assert normalized(other) == normalized(first)
    names = [load(p)["cluster_name"] for p in yaml_paths()]
    assert len(set(names)) == len(names)


def test_index_table():
    assert index_has_sm70("2.13.0", "https://download.pytorch.org/whl/cu126")
    assert not index_has_sm70("2.13.0", "https://download.pytorch.org/whl/cu130")
    assert not index_has_sm70("2.13.0", "https://download.pytorch.org/whl/cu128")
    assert not index_has_sm70("2.13.0", None)  # PyPI: the CUDA 13.0 build
    assert index_has_sm70("2.10.0", "https://download.pytorch.org/whl/cu128")


def test_request_nodes_reads_gpus_per_node():
    spec = importlib.util.spec_from_file_location("request_nodes", CLUSTER / "request_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path in yaml_paths():
        prepared = ray_checks(load(path))
        gpus = INSTANCES[prepared["available_node_types"][WORKER]["node_config"]["InstanceType"]][0]
        assert module.gpus_per_worker_node(prepared) == gpus
        assert module.bundles(3, gpus) == [{"GPU": gpus}] * 3
        assert module.bundles(0, gpus) == []


# ---- the checks can fail ----------------------------------------------------------------------


@pytest.fixture
def p3_16() -> dict:
    return load(CLUSTER / "aws-p3.16xlarge.yaml")


def test_ray_validator_refuses_unknown_top_level_key(p3_16):
    p3_16["head_node_typ"] = "head"
    with pytest.raises(jsonschema.ValidationError, match="head_node_typ"):
        ray_checks(p3_16)


def test_ray_validator_refuses_fractional_gpu_resource(p3_16):
    p3_16["available_node_types"][WORKER]["resources"]["GPU"] = 7.5
    with pytest.raises(jsonschema.ValidationError):
        ray_checks(p3_16)


def test_dashboard_open_to_the_internet_is_caught(p3_16):
    p3_16["provider"]["security_group"]["IpPermissions"] = [
        {"IpProtocol": "tcp", "FromPort": 8265, "ToPort": 8265, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
    ]
    prepared = ray_checks(p3_16)  # Ray itself has nothing against it
    assert ingress_problems(prepared) == ["open to the internet: protocol tcp ports 8265-8265"]


def test_everything_open_over_ipv6_is_caught(p3_16):
    p3_16["provider"]["security_group"]["IpPermissions"] = [
        {"IpProtocol": "-1", "FromPort": -1, "ToPort": -1, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}
    ]
    assert ingress_problems(ray_checks(p3_16)) == ["open to the internet: protocol -1 ports -1--1"]


def test_dashboard_on_all_interfaces_is_caught(p3_16):
    p3_16["head_start_ray_commands"] = [c.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0") for c in p3_16["head_start_ray_commands"]]
    assert control_plane_problems(ray_checks(p3_16)) == ["the head's dashboard does not listen on loopback only"]


def test_wrong_gpu_count_is_caught(p3_16):
    p3_16["available_node_types"][WORKER]["resources"]["GPU"] = 4
    assert resource_problems(ray_checks(p3_16), "p3.16xlarge") == ["p3.16xlarge has 8 GPUs, resources say 4"]


def test_unpinned_image_is_caught(p3_16):
    p3_16["available_node_types"][WORKER]["node_config"]["ImageId"] = "latest_dlami"
    assert image_problems(ray_checks(p3_16)) == ["gpu_worker: ImageId 'latest_dlami' is not a pinned AMI id"]


def test_torch_from_pypi_or_cuda13_is_caught(p3_16):
    for old, new in [("--index-url https://download.pytorch.org/whl/cu126", ""), ("cu126", "cu130")]:
        broken = copy.deepcopy(p3_16)
        broken["setup_commands"] = [c.replace(old, new) for c in broken["setup_commands"]]
        problems = torch_problems(ray_checks(broken))
        assert problems and all("no sm_70" in p for p in problems), problems


def test_second_mount_and_small_cluster_are_caught(p3_16):
    (mount,) = _mount_commands(p3_16["setup_commands"])
    p3_16["worker_setup_commands"].append(mount)
    p3_16["available_node_types"][WORKER]["max_workers"] = 8
    prepared = ray_checks(p3_16)
    assert storage_problems(p3_16) == ["worker_setup_commands mounts /mnt/efs too: set shared storage in one place"]
    assert size_problems(prepared) == ["gpu_worker.max_workers 8 < 16"]
