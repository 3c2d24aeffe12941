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

import copy
import importlib.util
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from scaling.cluster_check import (  # noqa: E402
    ROOT,
    CLUSTER,
    INSTANCES,
    WORKER,
    SHARED_MOUNT,
    index_has_sm70,
    load,
    ray_checks,
    resource_problems,
    storage_problems,
    ingress_problems,
    control_plane_problems,
    image_problems,
    size_problems,
    torch_problems,
    spot_problems,
    SPOT_WORKER,
    _mount_commands,
)


def yaml_paths() -> list[Path]:
    """The committed cluster YAMLs, cluster/aws-*.yaml."""
    return sorted(CLUSTER.glob("aws-*.yaml"))


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
    for key in (
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
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
        for name in (WORKER, SPOT_WORKER):
            worker = raw["available_node_types"][name]
            worker["resources"] = worker["node_config"]["InstanceType"] = None
        return raw

    first, *rest = [load(p) for p in yaml_paths()]
    for other in rest:
        assert normalized(other) == normalized(first)
    names = [load(p)["cluster_name"] for p in yaml_paths()]
    assert len(set(names)) == len(names)


def test_spot_worker_beside_the_on_demand_one(cluster_yaml):
    _, raw, prepared = cluster_yaml
    assert spot_problems(prepared) == []
    spot = prepared["available_node_types"][SPOT_WORKER]
    assert spot["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert (
        resource_problems(
            {**prepared, "available_node_types": {**prepared["available_node_types"], WORKER: spot}},
            spot["node_config"]["InstanceType"],
        )
        == []
    )


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
        assert module.bundles(2, gpus, "spot") == [{"GPU": gpus, "spot_node": 1}] * 2
        # the resource a spot request names is the one only the spot type has
        types = prepared["available_node_types"]
        assert [n for n, t in types.items() if module.SPOT_RESOURCE in t.get("resources", {})] == [SPOT_WORKER]


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
    p3_16["head_start_ray_commands"] = [
        c.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0") for c in p3_16["head_start_ray_commands"]
    ]
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


def test_spot_type_that_is_not_spot_or_not_the_same_node_is_caught(p3_16):
    spot = p3_16["available_node_types"][SPOT_WORKER]
    spot["node_config"]["InstanceMarketOptions"]["MarketType"] = "capacity-block"
    spot["node_config"]["InstanceType"] = "p3.8xlarge"
    problems = spot_problems(ray_checks(p3_16))
    assert any("not 'spot'" in p for p in problems) and any("InstanceType" in p for p in problems)
    del p3_16["available_node_types"][SPOT_WORKER]
    assert spot_problems(ray_checks(p3_16)) == [f"no '{SPOT_WORKER}' node type beside '{WORKER}'"]


def test_cli_checks_a_cluster_yaml(tmp_path, capsys):
    from scaling.cli import main

    assert main(["cluster", "check", *[str(p) for p in yaml_paths()]]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == 4, out
    bad = copy.deepcopy(load(CLUSTER / "aws-p3.16xlarge.yaml"))
    bad["available_node_types"][WORKER]["resources"]["GPU"] = 4
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["cluster", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "8 GPUs" in err and "Traceback" not in err
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump({**load(CLUSTER / "aws-p3.16xlarge.yaml"), "colour": "red"}))
    assert main(["cluster", "check", str(tmp_path / "unknown.yaml")]) == 2
    assert "Ray's validator refuses it" in capsys.readouterr().err
