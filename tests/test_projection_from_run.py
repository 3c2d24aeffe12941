"""`scaling project RUN_DIR`: a user's own measured run projected onto cluster presets (from_run.py).

The run directories are written here with the records' own writers (scaling/results.py), shaped as
the instrument writes them: summary.json, compute_profile.json, epochs.parquet, steps.parquet/ parts
and, for an FSDP2 run, collectives.parquet/ parts. A small transformer of 4 blocks, 2 workers' worth
of records on a CPU, and one run as if measured on an H100.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.errors import UsageError
from scaling.projection.from_run import project_run, run_layer_table
from scaling.results import (
    COLLECTIVES_PARQUET,
    COMPUTE_PROFILE_JSON,
    EPOCHS_PARQUET,
    STEPS_PARQUET,
    SUMMARY_JSON,
    RunDir,
    rank_part_path,
    write_json_atomic,
    write_parquet_atomic,
    write_text_atomic,
)

PARAMETERS = 4 * 3_000_000 + 2_000_000  # 4 blocks and a root (embeddings, head)
TOKENS = 512
BATCH = 8


def _job_run(path, gpu_name=None, backend="ddp", steps=40, seed=0):
    """A finished run of a user's job with `steps` steady-state steps of spread compute."""
    rng = np.random.default_rng(seed)
    summary = {
        "model": "MyTransformer",
        "num_workers": 1,
        "per_worker_batch": BATCH,
        "global_batch": BATCH,
        "precision": "bf16",
        "backend": "fsdp" if backend == "fsdp" else "gloo",
        "data_s": 0.001,
        "forward_s": 0.1,
        "backward_s": 0.2,
        "optimizer_s": 0.01,
        "exposed_comm_s": 0.0,
        "mfu": 0.4 if gpu_name else None,
        "fsdp_reshard_after_forward": True if backend == "fsdp" else None,
        "fsdp_reduce_dtype": "fp32" if backend == "fsdp" else None,
        "hardware": {"gpu_name": gpu_name, "cpu_model": "a test CPU"},
    }
    write_json_atomic(path / SUMMARY_JSON, summary)
    flops_per_token = 6 * PARAMETERS
    write_json_atomic(
        path / COMPUTE_PROFILE_JSON,
        {
            "precision": "bf16",
            "per_worker_batch": BATCH,
            "parameters": PARAMETERS,
            "tokens_per_sample": TOKENS,
            "forward_flops": flops_per_token / 3 * TOKENS,
            "backward_flops": 2 * flops_per_token / 3 * TOKENS,
            "train_flops": flops_per_token * TOKENS,
            "activation_elements": 40_000.0 * TOKENS,
        },
    )
    write_text_atomic(path / "config.yaml", "instrument:\n  ddp_bucket_cap_mb: 25.0\n")
    write_parquet_atomic(
        path / EPOCHS_PARQUET, pd.DataFrame({"epoch": [1], "samples": [BATCH * steps], "train_s": [0.31 * steps]})
    )
    scale = rng.normal(1.0, 0.05, size=steps + 2)
    write_parquet_atomic(
        rank_part_path(path / STEPS_PARQUET, 0, 1),
        pd.DataFrame(
            {
                "epoch": 1,
                "step": np.arange(steps + 2),
                "rank": 0,
                "kind": "train",
                "warmup": [True] * 2 + [False] * steps,
                "data_s": 0.001,
                "forward_s": 0.1 * scale,
                "backward_s": 0.2 * scale,
                "optimizer_s": 0.01,
                "exposed_comm_s": 0.0,
            }
        ),
    )
    if backend == "fsdp":  # one step's reduce-scatters, in backward order: blocks 3..0, then the root
        modules = ["layers.3", "layers.2", "layers.1", "layers.0", "root"]
        write_parquet_atomic(
            rank_part_path(path / COLLECTIVES_PARQUET, 0, 1),
            pd.DataFrame(
                {
                    "epoch": 1,
                    "step": steps + 1,
                    "step_kind": "train",
                    "warmup": False,
                    "rank": 0,
                    "index": range(5),
                    "collective": "reduce_scatter",
                    "module": modules,
                    "pass": "backward",
                    "bytes": [4 * 3_000_000] * 4 + [4 * 2_000_000],
                }
            ),
        )
    return RunDir(path)


def test_a_cpu_run_projects_onto_p5_with_intervals_and_says_what_set_each_parameter(tmp_path):
    run = _job_run(tmp_path)
    df = project_run(run, "p5.48xlarge", [8, 32, 128])
    assert df["num_workers"].tolist() == [1, 8, 32, 128]
    for figure in ("step_s", "throughput_samples_per_s", "allreduce_pct", "exposed_comm_pct", "comm_overhead_pct"):
        assert (df[f"{figure}_lo"] <= df[figure] + 1e-12).all() and (df[figure] <= df[f"{figure}_hi"] + 1e-12).all()
    assert (df["step_s_hi"] > df["step_s_lo"]).all()
    # a CPU's compute is not the GPU's: the run's FLOPs at the H100's published MFU of its bf16 peak
    flops = 6 * PARAMETERS * TOKENS * BATCH
    fb = df["forward_s"].iloc[0] + df["backward_compute_s"].iloc[0]
    assert fb == pytest.approx(flops / (0.33 * 989.4e12))
    said = {name: (value, source) for name, value, source in df.attrs["parameters"]}
    assert "cannot be the GPU's" in said["forward + backward compute"][1]
    assert "compute_profile.json parameters" in said["model size"][1]
    assert "percentiles" in said["interval"][1]
    # DDP: the gradients' bytes all-reduce, memory includes the runtime's
    assert df["grad_bytes"].iloc[-1] == 4 * PARAMETERS
    assert (df["memory_gib"] > df["memory_reserved_gib"]).all() and df["fits"].all()
    assert 0 < df["exposed_comm_pct"].iloc[-1] <= df["allreduce_pct"].iloc[-1]


def test_fsdp2_units_come_from_the_runs_collectives(tmp_path):
    run = _job_run(tmp_path, backend="fsdp")
    table, source = run_layer_table(run, run.compute_profile(), "fsdp")
    assert [u["name"] for u in table["units"]] == ["root", "layers.0", "layers.1", "layers.2", "layers.3"]
    assert [u["params"] for u in table["units"]] == [2_000_000] + [3_000_000] * 4 and "collectives.parquet" in source
    df = project_run(run, "h200x8_400g_per_gpu", [8, 128], backend="fsdp", compute_ms=20.0)
    assert df.attrs["backend"] == "fsdp" and (df["allgather_s"].iloc[1:] > 0).all()
    # sharded state falls with the GPUs; compute given by the user
    assert df["memory_states_bytes"].iloc[2] == pytest.approx(16 * PARAMETERS / 128)
    assert df["forward_s"].iloc[0] + df["backward_compute_s"].iloc[0] == pytest.approx(0.020)
    with pytest.raises(UsageError, match="--fsdp-units"):
        project_run(_job_run(tmp_path / "ddp"), "p5.48xlarge", [8], backend="fsdp")
    even = project_run(_job_run(tmp_path / "ddp2"), "p5.48xlarge", [8], backend="fsdp", fsdp_units=4)
    assert even["num_buckets"].iloc[1] > 0


def test_a_run_on_the_targets_gpu_keeps_its_compute_and_its_jitter(tmp_path):
    run = _job_run(tmp_path, gpu_name="NVIDIA H100 80GB HBM3")
    df = project_run(run, "p5.48xlarge", [8, 128])
    steps = run.steps()
    steps = steps[~steps["warmup"]]
    assert df["forward_s"].iloc[0] == pytest.approx(steps["forward_s"].mean())
    said = {name: (value, source) for name, value, source in df.attrs["parameters"]}
    assert "the run's" in said["step jitter (CV)"][1] and df["straggler_s"].iloc[-1] > df["straggler_s"].iloc[1] > 0
    # another device: the run's own MFU transfers (A100 has no published one)
    a100 = project_run(run, "p4d.24xlarge", [8])
    assert "the run's own" in {n: s for n, _, s in a100.attrs["parameters"]}["forward + backward compute"]


def test_the_cli_prints_the_curve_with_intervals_and_the_sources(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    run = _job_run(tmp_path / "job")
    assert cli.main(["project", str(run), "--cluster", "p5.48xlarge", "--gpus", "8,32,128"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job on p5.48xlarge, ddp: the run's job projected")  # the run directory's name
    assert "[" in out and "set by" in out and "cannot be the GPU's" in out
    assert cli.main(["project", str(run), "--cluster", "p5.48xlarge", "--gpus", "8", "--json"]) == 0
    assert '"step_s_lo"' in capsys.readouterr().out
    assert cli.main(["project", str(tmp_path / "nothing"), "--cluster", "p5.48xlarge", "--gpus", "8"]) == 2
    assert "summary.json" in capsys.readouterr().err


def _one_worker_fsdp_run(path, seed=0):
    """A 1-worker FSDP2 run: no collectives, its units as the instrument records them (compute_profile.json
    `sharded_units`: module, parameters, resharded after forward), on a CPU whose copy bandwidth it measured."""
    run = _job_run(path, seed=seed)
    profile = run.compute_profile()
    profile["sharded_units"] = [["root", 2_000_000, False]] + [[f"layers.{i}", 3_000_000, True] for i in range(4)]
    profile["mem_bytes_per_s"] = 40e9
    write_json_atomic(path / COMPUTE_PROFILE_JSON, profile)
    summary = run.summary()
    summary.update(backend="gloo", fsdp_reshard_after_forward=None, fsdp_reduce_dtype=None)
    write_json_atomic(path / SUMMARY_JSON, summary)
    # two epochs of training, 20 s each, from a shared clock: runs made at the same time overlap
    write_parquet_atomic(
        path / EPOCHS_PARQUET,
        pd.DataFrame(
            {
                "epoch": [1, 2],
                "samples": [BATCH * 20] * 2,
                "train_s": [20.0, 20.0],
                "first_step_unix": [1_000.0, 1_000.0],
                "elapsed_wall_s": [20.0, 40.0],
            }
        ),
    )
    return RunDir(path)


def test_a_one_worker_fsdp2_run_projects_onto_a_minicluster_of_its_own_machine(tmp_path):
    from scaling.projection.compute import jitter_straggler_s
    from scaling.projection.from_run import reshard_policy
    from scaling.projection.project import cluster_from_alpha_beta

    run = _one_worker_fsdp_run(tmp_path / "solo")
    cluster = cluster_from_alpha_beta(0.0, 12.5e6, gpus_per_node=1)  # 100 Mbit/s, no device: the run's own CPU
    with pytest.raises(UsageError, match="--mfu"):  # another device's compute is not the run's
        project_run(run, cluster, [2], backend="fsdp")
    # the CLI passes its unset options as None: the run's own resharding still applies
    df = project_run(
        run, cluster, [1, 2], backend="fsdp", same_device=True, fsdp_process_group="gloo", reshard_after_forward=None
    )
    said = {name: (value, source) for name, value, source in df.attrs["parameters"]}
    assert "sharded_units" in said["FSDP units"][0] and said["resharded after forward"][0] == "all"
    assert any("4 blocks resharded" in note and "(all)" in note for note in df.attrs["notes"])
    steps = run.steps()
    steps = steps[~steps["warmup"]]
    assert df["forward_s"].iloc[0] == pytest.approx(steps["forward_s"].mean())  # measured, not transferred
    # the optimizer's bytes shrink with the shards, its per-tensor remainder does not
    moved = 28 * PARAMETERS / 40e9
    assert df["optimizer_s"].iloc[1] == pytest.approx(0.01 - moved + moved / 2)
    # gloo: each of the step's K collectives waits for the slower rank: sqrt(K) x the step's wait
    compute = steps["data_s"].mean() + steps["forward_s"].mean() + steps["backward_s"].mean()
    cv = float((steps["data_s"] + steps["forward_s"] + steps["backward_s"] + steps["optimizer_s"]).std())
    cv /= float((steps["data_s"] + steps["forward_s"] + steps["backward_s"] + steps["optimizer_s"]).mean())
    collectives = int(df["num_buckets"].iloc[1])
    assert collectives == 5 + 4 + 5  # all-gathers, re-gathers of the 4 resharded blocks, reduce-scatters
    expected_wait = jitter_straggler_s(compute, cv, 2) * collectives**0.5
    assert df["straggler_s"].iloc[1] == pytest.approx(expected_wait, rel=1e-6)
    # an all-gather measured apart at half the all-reduce's bus bandwidth takes twice as long
    slow = cluster_from_alpha_beta(0.0, 12.5e6, gpus_per_node=1, allgather_alpha_s=0.0, allgather_bytes_per_s=6.25e6)
    halved = project_run(run, slow, [1, 2], backend="fsdp", same_device=True, fsdp_process_group="gloo")
    assert halved["allgather_s"].iloc[1] == pytest.approx(2 * df["allgather_s"].iloc[1])
    assert halved["reducescatter_s"].iloc[1] == pytest.approx(df["reducescatter_s"].iloc[1])

    # two 1-worker runs made at the same time: their compute under each other's load and the wait they measure
    pair = [_one_worker_fsdp_run(tmp_path / f"pair{i}", seed=1 + i) for i in range(2)]
    both = project_run(pair, cluster, [1, 2], backend="fsdp", same_device=True, fsdp_process_group="gloo")
    said = {name: (value, source) for name, value, source in both.attrs["parameters"]}
    assert "2 concurrent 1-worker runs" in said["straggler wait"][1]
    assert "pair0" in both.attrs["run"] and "pair1" in both.attrs["run"]

    assert reshard_policy([["root", 1, False], ["a", 1, True], ["b", 1, True]]) == "all"
    assert reshard_policy([["root", 1, True], ["a", 1, True]]) == "all-and-root"
    assert reshard_policy([["root", 1, False], ["a", 1, True], ["b", 1, False]]) == "all-but-last"
    assert reshard_policy([["root", 1, False], ["a", 1, False]]) == "none"
    assert reshard_policy([["root", 1, True], ["a", 1, False]]) is None
    assert reshard_policy([["root", 1]]) is None


def test_a_bare_model_at_one_worker_is_said_to_lack_ddps_own_work(tmp_path):
    """Ray's prepare_model wraps DDP only at 2+ workers: a DDP projection from a 1-worker run of the bare model
    says that DDP's own per-step work is not in it; from a run wrapped at one worker, it says nothing."""
    from scaling.projection.from_run import BARE_MODEL_NOTE

    for data_parallel, said in (("local", True), ("ddp", False)):
        run = _job_run(tmp_path / data_parallel)
        write_json_atomic(run.path / "job.json", {"model": "MyTransformer", "data_parallel": data_parallel})
        notes = project_run(run, "p5.48xlarge", [8]).attrs["notes"]
        assert (BARE_MODEL_NOTE in notes) is said
    fsdp = _job_run(tmp_path / "fsdp", backend="fsdp")
    write_json_atomic(fsdp.path / "job.json", {"model": "MyTransformer", "data_parallel": "local"})
    assert BARE_MODEL_NOTE not in project_run(fsdp, "p5.48xlarge", [8], backend="fsdp").attrs.get("notes", [])


def test_a_run_projects_with_its_own_backend_unless_told(tmp_path):
    """A run whose job sharded (job.json data_parallel: fsdp) projects as FSDP2 by default, any other as DDP;
    a backend given is a what-if, and the report says which it was."""
    fsdp = _job_run(tmp_path / "fsdp", backend="fsdp")
    write_json_atomic(fsdp.path / "job.json", {"model": "MyTransformer", "data_parallel": "fsdp"})
    ddp = _job_run(tmp_path / "ddp")
    write_json_atomic(ddp.path / "job.json", {"model": "MyTransformer", "data_parallel": "ddp"})
    own = project_run(fsdp, "p5.48xlarge", [8], compute_ms=20.0)
    said = {name: (value, source) for name, value, source in own.attrs["parameters"]}
    assert own.attrs["backend"] == "fsdp" and said["backend"] == ("fsdp", "the run's data_parallel: fsdp")
    assert (own["allgather_s"].iloc[1:] > 0).all()
    assert project_run(ddp, "p5.48xlarge", [8]).attrs["backend"] == "ddp"
    what_if = project_run(fsdp, "p5.48xlarge", [8], "ddp", compute_ms=20.0)
    said = {name: (value, source) for name, value, source in what_if.attrs["parameters"]}
    assert what_if.attrs["backend"] == "ddp" and said["backend"][1] == "given (the run's data_parallel: fsdp)"


def test_a_multi_worker_runs_compute_rests_on_its_steps_with_timed_communication(tmp_path):
    """A step whose collectives were not timed (instrument.collective_timing_every) holds its wait for them in
    backward_s, unmeasured: the run's compute is read from the timed steps only, not from every step's backward
    with that wait counted as compute."""
    run = _job_run(tmp_path / "job", gpu_name="NVIDIA H100 80GB HBM3")
    summary = run.summary()
    summary.update(num_workers=2, exposed_comm_s=0.1)
    write_json_atomic(run.path / SUMMARY_JSON, summary)
    steps = pd.read_parquet(rank_part_path(run.path / STEPS_PARQUET, 0, 1))
    timed = steps["step"] % 4 == 0  # one step in four timed, as after the instrument's first timed steps
    steps["backward_s"] = 0.2 + 0.1  # every step waited 100 ms on its all-reduce inside backward
    steps["exposed_comm_s"] = np.where(timed, 0.1, np.nan)
    write_parquet_atomic(rank_part_path(run.path / STEPS_PARQUET, 0, 1), steps)
    said = {name: (value, source) for name, value, source in project_run(run, "h100x8", [1, 2]).attrs["parameters"]}
    # forward 0.1 + backward 0.2 (each step's at its drawn scale, 5% spread); with the untimed steps' wait as
    # compute it would be 375 ms
    assert abs(float(said["forward + backward compute"][0].split()[0]) - 300.0) < 15.0
    assert "mean of 10 steps" in said["data wait"][1]  # the 10 timed of the 40 steady steps
    steps["exposed_comm_s"] = np.where(steps["step"] == 4, 0.1, np.nan)
    write_parquet_atomic(rank_part_path(run.path / STEPS_PARQUET, 0, 1), steps)
    with pytest.raises(UsageError, match="1 steady-state training step.*timed communication"):
        project_run(run, "h100x8", [1, 2])
