"""Config: typed loading, refusal of unknown keys and bad values, overrides, CLI exit codes."""

import torch
import pytest
import yaml

from scaling.config import ConfigError, ExperimentConfig, from_dict, load_config
from tests.conftest import REPO, run_cli

QUICKSTART = REPO / "experiments" / "quickstart.yaml"


def test_quickstart_loads_and_round_trips():
    cfg = load_config(QUICKSTART)
    assert cfg.model.name == "small_cnn"
    assert from_dict(yaml.safe_load(cfg.to_yaml())) == cfg


def test_overrides_and_workers():
    cfg = load_config(QUICKSTART, overrides=["optim.lr=0.2", "train.max_epochs=8", "backend=gloo"], num_workers=1)
    assert cfg.optim.lr == 0.2 and isinstance(cfg.optim.lr, float)
    assert cfg.train.max_epochs == 8
    assert cfg.workers.num_workers == 1
    assert cfg.global_batch == cfg.train.per_worker_batch


def test_unknown_key_names_key_and_valid_ones():
    with pytest.raises(ConfigError) as err:
        from_dict({"optim": {"lrr": 0.1}})
    message = str(err.value)
    assert "optim.lrr" in message and "lr" in message and "momentum" in message


def test_wrong_type_is_refused():
    with pytest.raises(ConfigError, match="train.max_epochs"):
        from_dict({"train": {"max_epochs": "ten"}})
    with pytest.raises(ConfigError, match="workers.num_workers"):
        from_dict({"workers": {"num_workers": True}})


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=-0.1", "optim.lr"),
        ("optim.lr=0", "optim.lr"),
        ("train.target_accuracy=1.5", "train.target_accuracy"),
        ("train.target_accuracy=0", "train.target_accuracy"),
        ("train.per_worker_batch=0", "train.per_worker_batch"),
        ("model.name=resnet9000", "model.name"),
        ("data.name=imagenet21k", "data.name"),
        ("backend=mpi", "backend"),
        ("optim.schedule=linear", "optim.schedule"),
        ("train.precision=fp8", "train.precision"),
        ("train.tta_rule=last", "train.tta_rule"),
        ("train.target_metric=top3", "train.target_metric"),
        ("instrument.grad_compression=int8", "instrument.grad_compression"),
        ("failure.capacity_wait_s=0", "failure.capacity_wait_s"),
        ("workers.market=reserved", "workers.market"),
    ],
)
def test_impossible_values_are_refused(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(QUICKSTART, overrides=[override])


def test_closed_choices_are_types_refused_when_the_tree_is_built():
    with pytest.raises(
        ConfigError, match=r"config key 'backend' must be one of auto, gloo, nccl, fsdp, horovod; got 'mpi'"
    ):
        from_dict({"backend": "mpi"})
    with pytest.raises(ConfigError, match="train.precision"):
        from_dict({"train": {"precision": True}})
    assert from_dict({"train": {"precision": "bf16"}}).train.precision == "bf16"


@pytest.mark.slow  # a fresh interpreter: what importing the config pulls in can only be seen from an empty sys.modules
def test_config_is_data_it_imports_nothing_that_looks_at_the_world():
    """Loading and validating a config imports neither the launchers, the training code, the
    projection nor Ray: whatever looks at the world is the preflight's (scaling/launch/preflight.py)."""
    import subprocess
    import sys

    code = (
        "import sys; from scaling.config import load_config, validate; "
        f"validate(load_config({str(QUICKSTART)!r}, overrides=['workers.cluster=p9.huge', 'data.name=cifar10', "
        "'data.path=/nonexistent', 'workers.link_bandwidth=fast', 'model.name=no_such.module:net'])); "
        "print(sorted(m for m in sys.modules if m.startswith(('scaling.launch', 'scaling.train', 'scaling.projection', "
        "'ray'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.train_samples=10", "smaller than the global batch"),
        ("workers.link_bandwidth=fast", "tc rate"),
        ("workers.link_bandwidth=1gbit", "needs a minicluster"),
        ("workers.cluster=p9.huge", "p9.huge"),
        ("data.path=/nonexistent/cifar", "does not exist"),
        ("model.name=tests.user_callables:broken_model", "does not build"),
    ],
)
def test_what_looks_at_the_world_is_the_preflights(override, message):
    from scaling.errors import UsageError
    from scaling.launch.preflight import preflight

    overrides = (
        [override, "data.name=cifar10", "data.image_size=32"] if override.startswith("data.path") else [override]
    )
    cfg = load_config(QUICKSTART, overrides=overrides)  # the shape is fine
    with pytest.raises(UsageError, match=message):  # a ConfigError, or the dataset's own error
        preflight(cfg, "local", capacity=False)


def test_a_sweep_preflights_each_distinct_config_once(monkeypatch):
    from scaling.launch import preflight as preflight_module
    from scaling.launch.sweep import plan_sweep

    checked = []
    monkeypatch.setattr(
        preflight_module, "check_user_code", lambda cfg: checked.append((cfg.workers.num_workers, cfg.train.seed))
    )
    monkeypatch.setattr(preflight_module, "check_capacity", lambda cfg, launcher, log_to_driver=True: None)
    _, _, planned = plan_sweep(QUICKSTART, [1, 2], 3)
    assert len(planned) == 6
    preflight_module.preflight_sweep(planned, "local")
    assert sorted(w for w, _ in checked) == [1, 2]  # three repeats of each point differ only in the seed


def test_workers_below_one_refused():
    with pytest.raises(ConfigError, match="workers"):
        load_config(QUICKSTART, num_workers=0)


def test_defaults_are_a_valid_config():
    from scaling.config import validate

    validate(ExperimentConfig())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["backend=nccl"], "backend nccl needs workers.use_gpu: true"),
        (["instrument.ddp_bucket_cap_mb=0"], "instrument.ddp_bucket_cap_mb must be > 0, got 0.0"),
        (
            ["backend=horovod", "instrument.horovod_fusion_threshold_mb=-1"],
            "instrument.horovod_fusion_threshold_mb must be >= 0, got -1.0",
        ),
        (
            ["backend=horovod", "instrument.horovod_cycle_time_ms=0"],
            "instrument.horovod_cycle_time_ms must be > 0, got 0.0",
        ),
    ],
)
def test_a_backends_own_settings_are_checked_by_its_adapter(overrides, message):
    """Each backend's config checks sit beside it (its `config_problems`, scaling/backend_choices.py);
    `validate` asks the selected backend's, so another backend's settings are not its business."""
    from scaling.config import apply_overrides
    from scaling.backend_choices import for_choice

    with pytest.raises(ConfigError) as refused:
        load_config(QUICKSTART, overrides=overrides)
    assert str(refused.value) == message
    cfg = from_dict(apply_overrides({}, overrides))  # the defaults with the overrides, not validated
    assert for_choice(cfg.backend).config_problems(cfg) == [message]
    if cfg.backend == "horovod":  # Horovod's tuning is no concern of DDP's
        cfg.backend = "auto"
        assert for_choice(cfg.backend).config_problems(cfg) == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--set", "optim.lrr=0.1"], "optim.lrr"),
        (["--set", "optim.lr=-0.1"], "optim.lr"),
        (["--workers", "two"], "--workers"),
        (["--set", "nonsense"], "key=value"),
        (["--set", "train.max_epochs=two"], "train.max_epochs"),  # wrong type
        (["--workers", "0"], "workers"),
        (["--set", "train.per_worker_batch=0"], "train.per_worker_batch"),
        (["--set", "train.target_accuracy=1.5"], "train.target_accuracy"),
        (["--set", "model.name=resnet9000"], "model.name"),
        (["--set", "data.name=imagenet21k"], "data.name"),
        (["--set", "data.name=cifar10", "--set", "data.path=/nonexistent/cifar"], "does not exist"),
        (["--set", "data.name=imagenet", "--set", "data.path=/tmp"], "has no 'train' folder"),
        (["--set", "workers.link_bandwidth=fast"], "tc rate"),
        (["--set", "workers.cluster=p9.huge"], "p9.huge"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, args, needle):
    # In process (`cli.main`, what the console script calls): the console script itself is
    # exercised by the subprocess tests below; here the many inputs stay fast.
    from scaling import cli

    out = tmp_path / "run"
    code = cli.main(["run", str(QUICKSTART), "--out", str(out), *args])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], stderr
    assert "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.slow  # the console script itself, in a subprocess: its exit status and stderr as a user sees them
def test_cli_missing_config_file(tmp_path):
    result = run_cli("run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "not found" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_yaml_syntax_error_is_one_line_with_its_line_and_column(tmp_path, capsys):
    from scaling import cli

    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: small_cnn\ntrain: [1, 2\n")  # the flow sequence is never closed
    code = cli.main(["run", str(bad), "--out", str(tmp_path / "run")])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}:4:1: not valid YAML" in lines[0], stderr
    assert not (tmp_path / "run").exists()


def test_cli_unwritable_output_directory(tmp_path, capsys):
    from scaling import cli

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code = cli.main(["run", str(QUICKSTART), "--out", str(blocker / "run"), "--launcher", "local"])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "not writable" in stderr and "Traceback" not in stderr


def test_pin_cpus_is_a_cpu_list():
    from scaling.config import parse_cpu_list

    assert parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6] and parse_cpu_list("2,0,2") == [2, 0]
    assert load_config(QUICKSTART, overrides=["workers.pin_cpus=0"]).workers.pin_cpus == "0"
    for bad in ("a", "3-1", "0,,1", "-1"):
        with pytest.raises(ConfigError, match="workers.pin_cpus"):
            load_config(QUICKSTART, overrides=[f"workers.pin_cpus={bad}"])
    with pytest.raises(ConfigError, match="cpus_per_worker"):
        load_config(QUICKSTART, overrides=["workers.pin_cpus=0", "workers.cpus_per_worker=2"])


def test_pinning_moves_only_the_calling_thread():
    import os
    import threading

    from scaling.errors import UsageError
    from scaling.train.loop import pin_training_thread

    target = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    seen = {}

    def worker():
        seen["group"] = pin_training_thread(f"{target}", local_rank=0, cpus_per_worker=1)
        seen["after"] = os.sched_getaffinity(0)
        try:
            pin_training_thread(f"{target}", local_rank=1, cpus_per_worker=1)  # no second CPU named
        except UsageError as exc:
            seen["error"] = str(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["group"] == [target] and seen["after"] == {target}
    assert "local rank 1" in seen["error"]
    assert os.sched_getaffinity(0) == before  # the test's own thread is untouched


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.name=tests.user_callables:missing", "has no attribute 'missing'"),
        ("model.name=no_such_package.models:net", "cannot import no_such_package.models"),
        ("model.name=tests.user_callables:broken_model", "does not build: RuntimeError: boom"),
        ("model.name=tests.user_callables:not_a_module", "returned int, not a torch.nn.Module"),
        ("model.name=tests.user_callables:two_args", "must take 1 positional argument"),
        ("data.name=tests.user_callables:no_args", "must take 1 positional argument"),
        ("train.function=tests.user_callables:two_args", "must take 1 positional argument"),
        ("train.function=tests.user_callables", "not an import path of the form package.module:callable"),
        ("model.name=resnet5O", "or a model of your own as package.module:callable"),
    ],
)
def test_a_bad_import_path_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, override, message):
    from scaling import cli

    out = tmp_path / "run"
    code = cli.main(["run", str(QUICKSTART), "--launcher", "local", "--out", str(out), "--set", override])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_a_users_model_by_import_path_builds_and_a_train_function_needs_ray(tmp_path, capsys):
    cfg = load_config(QUICKSTART, overrides=["model.name=tests.user_callables:linear_model"])
    from scaling import cli
    from scaling.models import build_model

    assert isinstance(build_model(cfg.model.name, 10)[1], torch.nn.Linear)
    code = cli.main(
        ["run", str(REPO / "examples" / "own_job" / "sweep.yaml"), "--launcher", "local", "--out", str(tmp_path / "r")]
    )
    stderr = capsys.readouterr().err
    assert code == 2 and "Ray launcher" in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_an_elastic_run_needs_the_ray_launcher():
    from scaling.launch.preflight import preflight

    cfg = load_config(QUICKSTART, overrides=["workers.min_workers=1"], num_workers=2)  # the shape is fine
    with pytest.raises(ConfigError, match="min_workers.*needs Ray Train's restarts"):
        preflight(cfg, "local", capacity=False)
    preflight(cfg, "ray", capacity=False)


# --- the preflight's memory check: datasets and model against the memory the workers have -------

GIB = 2**30
TOO_BIG = "data.train_samples=1000000000"  # issue 28's typo: 12 TB of embedded float32 images per worker


def test_a_dataset_that_cannot_fit_is_refused_in_one_line_before_the_run_directory(tmp_path, capsys):
    from scaling import cli

    out = tmp_path / "run"
    code = cli.main(
        ["run", str(QUICKSTART), "--launcher", "local", "--workers", "1", "--set", TOO_BIG, "--out", str(out)]
    )
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    # the keys and the numbers: 1e9 x (3x32x32x4 + 8) + 2048 x 12,296 bytes held = 12,296 GB
    for needle in (
        "data.train_samples=1,000,000,000",
        "data.val_samples=2,048",
        "model.name=small_cnn",
        "GB per worker",
        "datasets 12,296 GB held",
        "of memory available",
    ):
        assert needle in lines[0], stderr
    assert not out.exists()


def test_the_memory_estimate_is_the_hand_count():
    """quickstart at 2 workers (DDP), counted by hand from scaling/data/embedded.py and SmallCNN."""
    from scaling.launch.preflight import estimate_worker_memory

    cfg = load_config(QUICKSTART, num_workers=2)
    estimate = estimate_worker_memory(cfg)
    image = 3 * 32 * 32 * 4  # float32
    train_images, val_images = 8192 * image, 2048 * image
    labels = (8192 + 2048) * 8  # int64
    assert estimate.dataset_bytes == train_images + val_images + labels == 125_911_040
    # the embedded generator holds six image-sized tensors of the training split at once
    assert estimate.dataset_peak_bytes == 6 * train_images + 8192 * 8 == 604_045_312
    # SmallCNN(10): convs 3*16*9 + 16*32*9 + 32*64*9, BN weights and biases 2*(16+32+64), linears
    # 1024*256+256 and 256*10+10: 288,666 parameters; BN running stats 224 floats + 3 int64 counters
    params = 432 + 4608 + 18432 + 2 * (16 + 32 + 64) + (1024 * 256 + 256) + (256 * 10 + 10)
    assert params == 288_666
    # weights, gradients, SGD momentum, DDP's gradient buckets (2 workers), and the buffers
    assert estimate.model_bytes == 4 * params * 4 + 224 * 4 + 3 * 8
    assert estimate.host_bytes == max(estimate.dataset_peak_bytes, estimate.dataset_bytes + estimate.model_bytes)
    one = estimate_worker_memory(load_config(QUICKSTART, num_workers=1))
    assert one.model_bytes == 3 * params * 4 + 224 * 4 + 3 * 8  # no buckets at one worker


def test_the_shipped_configs_fit_a_24_gib_machine():
    """Every experiments/*.yaml and examples/ config at each of its sweep's worker counts: the CPU
    ones on one 24 GiB host (the plain launcher), every one on Ray nodes of 24 GiB that each take
    eight workers, and GPU workers on 16 GB V100s."""
    import math

    from scaling.launch.preflight import check_gpu_memory, estimate_worker_memory, memory_refusal, workers_that_fit

    paths = sorted((REPO / "experiments").glob("*.yaml")) + sorted((REPO / "examples").rglob("*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        for workers in (yaml.safe_load(path.read_text()).get("sweep") or {}).get("workers", [None]):
            cfg = load_config(path, num_workers=workers)
            # the counts check_data reads from a path dataset: ILSVRC-2012's (CIFAR-10's are the default)
            estimate = estimate_worker_memory(
                cfg, {"train": 1_281_167, "val": 50_000} if cfg.data.name == "imagenet" else None
            )
            if estimate is None:
                assert cfg.train.function  # a user's function makes its own model and data
                continue
            n = cfg.workers.num_workers
            if not cfg.workers.use_gpu:
                assert memory_refusal(estimate, n, 24 * GIB) is None, (path.name, n)
            nodes = [{"CPU": 8 * cfg.workers.cpus_per_worker, "GPU": 8, "memory": 24 * GIB}] * math.ceil(n / 8)
            assert workers_that_fit(nodes, estimate.host_bytes, cfg.workers.cpus_per_worker, cfg.workers.use_gpu) >= n
            if cfg.workers.use_gpu:
                check_gpu_memory(estimate, min(n, 8), gpu_bytes=[16 * 10**9] * 8)


def test_memory_refusals_on_a_ray_cluster_a_gpu_and_a_sweep(monkeypatch):
    from scaling.errors import UsageError
    from scaling.launch import preflight as preflight_module
    from scaling.launch.preflight import check_gpu_memory, check_memory, estimate_worker_memory
    from scaling.launch.sweep import plan_sweep

    cfg = load_config(QUICKSTART, num_workers=4)  # 0.60 GB per worker at the embedded generator's peak
    small_nodes = [{"CPU": 2.0, "memory": 1.0e9}, {"CPU": 2.0, "memory": 1.0e9}]  # one such worker each
    with pytest.raises(
        UsageError,
        match=r"need 0.604 GB per worker .* the Ray cluster's nodes can hold 2 of the 4 "
        r"workers \(memory per node as Ray reports it: 1.00 GB, 1.00 GB\)",
    ):
        check_memory(cfg, "ray", nodes=small_nodes)
    check_memory(cfg, "ray", nodes=[{"CPU": 2.0, "memory": 2.0e9}] * 2)  # two each: fits
    check_memory(cfg, "ray", nodes=[{"CPU": 1.0, "memory": 1.0e12}])  # too few CPUs: check_capacity's refusal
    # the plain launcher: the host's memory shared by its workers
    with pytest.raises(UsageError, match=r"has 2.00 GB of memory available, 0.500 GB for each of its 4 workers"):
        check_memory(cfg, "local", available_bytes=2 * 10**9)
    check_memory(cfg, "local", available_bytes=3 * 10**9)
    # GPU workers: the held dataset and the model state in each GPU's memory, ranks sharing a GPU
    # 0.131 GB on the GPU: the dataset held and the model state
    estimate = estimate_worker_memory(load_config(QUICKSTART, overrides=["workers.use_gpu=true"], num_workers=4))
    check_gpu_memory(estimate, 4, gpu_bytes=[0.2e9] * 4)
    with pytest.raises(
        UsageError, match=r"need 0.131 GB of GPU memory per worker .* a GPU here has 0.500 GB shared by 4 workers"
    ):
        check_gpu_memory(estimate, 4, gpu_bytes=[0.5e9])
    # a sweep: each distinct config, named by its run
    monkeypatch.setattr(preflight_module, "check_capacity", lambda cfg, launcher, log_to_driver=True: None)
    _, _, planned = plan_sweep(QUICKSTART, [1, 2], 1, [TOO_BIG])
    with pytest.raises(UsageError, match=r"^sweep run w1-r0: data.name=embedded with data.train_samples=1,000,000,000"):
        preflight_module.preflight_sweep(planned, "local")


def test_the_ray_launcher_checks_memory_against_the_nodes_ray_reports(ray_connected):
    """The preflight reads each node's memory as Ray reports it (`ray.nodes()`) on the session's
    real cluster: a dataset no node can hold is refused naming Ray's figure; quickstart passes."""
    import ray

    from scaling.errors import UsageError
    from scaling.launch.preflight import _gb, check_memory, ray_node_resources

    nodes = ray_node_resources()
    reported = [n["memory"] for n in nodes]
    assert len(nodes) == len([n for n in ray.nodes() if n["Alive"]]) and all(m > 0 for m in reported)
    check_memory(load_config(QUICKSTART, num_workers=2), "ray")
    with pytest.raises(UsageError) as refused:
        check_memory(load_config(QUICKSTART, overrides=[TOO_BIG], num_workers=1), "ray")
    message = str(refused.value)
    assert "\n" not in message and "data.train_samples=1,000,000,000" in message
    assert (
        f"the Ray cluster's nodes can hold 0 of the 1 workers (memory per node as Ray reports it: {_gb(reported[0])}"
        in message
    )
