"""The wheel in environments the lab did not make (docs/install.md), as a user would install it.

One wheel is built from the checkout (`uv build`), then:
- **a user's older environment** (this Python, fresh venv): this machine's torch and the lowest
  numpy, pandas, pyarrow, pyyaml, rich and matplotlib that pyproject.toml's ranges allow are
  installed first; then the wheel with its `lab`, `hf` and `lightning` extras, after which every
  package installed before has the version it had (nothing upgraded, nothing removed). There the
  own-job example (examples/own_job, a Ray Train job) and the trainer examples with every line
  marked `# scaling` removed, each under `scaling attach -- torchrun --nproc_per_node 2`, run into
  run directories that `scaling report` reads (its figures drawn with the lowest matplotlib);
- **Python 3.10, 3.12 and 3.13** (fresh venvs, the wheel with its `plots` extra only): no torch and no
  Ray get installed; `scaling report` and `scaling project` run on those run directories; a lab
  command refuses in one line naming the extra (exit 2);
- **the wheel carries its package data**: every preset, layer table, the Grafana dashboard, the
  devices table and attach's bootstrap are in it.

Every process runs from a folder outside the checkout, so `import scaling` finds the installed
wheel, never the working tree. uv installs (its cache makes a second session's installs seconds);
the 3.12 and 3.13 venvs take the lab's uv.lock versions as constraints (3.10, which the locked numpy
and pandas do not support, takes none); the older environment takes
none (a user's resolver would have none), so what its extras bring is what PyPI offers that day.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import BIN, OTHER_PYTHONS, REPO, other_python

pytestmark = pytest.mark.slow

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKED = {p["name"]: p["version"] for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]}
# the packages a user's environment holds before the wheel, at the lowest versions the ranges allow
LOWEST = ("numpy", "pandas", "pyarrow", "pyyaml", "rich", "matplotlib")
UV = str(BIN / "uv")


def _lower_bounds() -> dict[str, str]:
    """name -> the lower bound pyproject.toml declares for it (the base dependencies and the extras)."""
    declared = list(PYPROJECT["project"]["dependencies"])
    for deps in PYPROJECT["project"]["optional-dependencies"].values():
        declared += deps
    bounds = {}
    for dep in declared:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?>=([0-9.]+).*", dep.strip())
        if m:
            bounds[m.group(1).lower()] = m.group(3)
    return bounds


def _torch_wheels() -> str:
    """Where the lab's uv.lock takes torch from ([[tool.uv.index]] torch-cpu: this machine's CPU build)."""
    (index,) = [i for i in PYPROJECT["tool"]["uv"]["index"] if i["name"] == "torch-cpu"]
    return index["url"]


def _run(cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _clean_env(venv: Path) -> dict:
    """The environment of a user's shell with `venv` activated: no lab venv, no checkout, no Ray address."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    env["VIRTUAL_ENV"] = str(venv)
    return env


def _uv_pip(venv: Path, *args, cwd) -> None:
    _run([UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", *args], cwd=cwd)


def _installed(venv: Path, cwd) -> dict[str, str]:
    out = _run([UV, "pip", "freeze", "--python", venv / "bin" / "python"], cwd=cwd).stdout
    # name==version, or name @ file:///... for the wheel itself
    return dict(re.split(r"==| @ ", line, maxsplit=1) for line in out.splitlines() if "==" in line or " @ " in line)


def _constraints(path: Path, leave_out) -> Path:
    """The lab's locked versions as pip constraints, but for `leave_out` (what the test installs itself)."""
    path.write_text("".join(f"{n}=={v}\n" for n, v in LOCKED.items() if n not in leave_out and n != "scaling-lab"))
    return path


@pytest.fixture(scope="module")
def work():
    """A folder outside the checkout, short enough for Ray's socket paths."""
    path = Path(tempfile.mkdtemp(prefix="slpkg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel(work) -> Path:
    out = work / "dist"
    _run([UV, "build", "--wheel", "--quiet", "-o", out, REPO], cwd=work)
    (built,) = out.glob("scaling_lab-*.whl")
    return built


@pytest.fixture(scope="module")
def older_env(work, wheel):
    """A user's venv with this machine's torch and the ranges' lowest numpy, pandas, pyarrow, pyyaml,
    rich and matplotlib; then the wheel with [lab,hf,lightning]. Yields (venv, before, after)."""
    import torch

    venv = work / "older"
    _run([UV, "venv", "--quiet", "--python", sys.executable, venv], cwd=work)
    bounds = _lower_bounds()
    _uv_pip(venv, f"torch=={torch.__version__}", "--find-links", _torch_wheels(), cwd=work)
    _uv_pip(venv, *(f"{name}=={bounds[name]}" for name in LOWEST), cwd=work)
    before = _installed(venv, work)
    _uv_pip(venv, f"{wheel}[lab,hf,lightning]", cwd=work)  # as a user would: no constraint, no --no-deps
    return venv, before, _installed(venv, work)


def test_the_wheel_changes_nothing_a_users_environment_had(older_env):
    venv, before, after = older_env
    bounds = _lower_bounds()
    assert all(Version(before[name]) == Version(bounds[name]) for name in LOWEST), before  # the lowest, as declared
    changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
    assert changed == {}, f"the install changed what the environment had: {changed}"
    assert {"scaling-lab", "ray", "transformers", "lightning"} <= set(after)


@pytest.fixture(scope="module")
def measured(work, older_env):
    """Run directories made in the older environment: the own-job example (Ray Train, 2 workers) and
    the HF and Lightning examples with their `# scaling` lines removed, under `scaling attach`."""
    venv = older_env[0]
    env = _clean_env(venv)
    env["RAY_TMPDIR"] = str(work / "ray")  # a Ray of its own, beside the session's
    env["RAY_AUTH_MODE"] = "disabled"
    jobs = work / "jobs"
    shutil.copytree(REPO / "examples" / "own_job", jobs / "examples" / "own_job")
    (jobs / "examples" / "__init__.py").write_text("")
    for name in ("hf_trainer", "lightning_job"):
        source = (REPO / "examples" / "trainers" / f"{name}.py").read_text().splitlines(keepends=True)
        (jobs / f"{name}.py").write_text("".join(line for line in source if "# scaling" not in line))
    sweep = work / "sweep"
    python, scaling = venv / "bin" / "python", venv / "bin" / "scaling"
    torchrun = [venv / "bin" / "torchrun", "--standalone", "--nproc_per_node", "2"]  # a free port each
    commands = {
        "own": [
            *(python, "-m", "examples.own_job.train"),
            *("--workers", "2", "--epochs", "1", "--out", sweep / "runs" / "own"),
        ],
        **{
            name: [scaling, "attach", "--out", sweep / "runs" / name, "--", *torchrun, f"{name}.py", *args]
            for name, args in (
                ("hf_trainer", ["--epochs", "1", "--hf-output", work / "hf"]),
                ("lightning_job", ["--epochs", "1"]),
            )
        },
    }  # fmt: skip
    # The three overlap: Ray's start (most of the own job's time) is mostly waiting, and so is a torchrun's.
    # The torchruns start once the own job's Ray is up: Ray gives its raylet a fixed 30 s to register, which
    # the two trainers' imports beside a loaded test session's other work have been measured to exceed.
    logs = {name: work / f"{name}.log" for name in commands}
    jobs_running = {}
    for name, cmd in commands.items():
        jobs_running[name] = subprocess.Popen(
            [str(c) for c in cmd], cwd=jobs, env=env, stdout=logs[name].open("w"), stderr=subprocess.STDOUT
        )
        if name == "own":
            _wait_for_line(jobs_running[name], logs[name], "Started a local Ray instance", timeout_s=300)
    for name, job in jobs_running.items():
        assert job.wait(timeout=600) == 0, f"{name} failed:\n{logs[name].read_text()[-3000:]}"
    return sweep


def _wait_for_line(job: subprocess.Popen, log: Path, line: str, timeout_s: float) -> None:
    """Returns once `line` is in the job's log, the job has ended (its exit status is checked later), or
    `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while job.poll() is None and line not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)


def test_the_trainer_examples_hold_no_scaling_line_once_stripped(work, measured):
    for name in ("hf_trainer", "lightning_job"):
        text = (work / "jobs" / f"{name}.py").read_text()
        assert "ScalingCallback" not in text and "from scaling" not in text


def test_the_older_environment_measures_and_reports(work, older_env, measured):
    venv = older_env[0]
    for run in ("own", "hf_trainer", "lightning_job"):
        assert (measured / "runs" / run / "summary.json").exists(), run
        assert list((measured / "runs" / run).glob("steps.parquet*")), run
    out = work / "report-older"
    done = _run([venv / "bin" / "scaling", "report", measured, "--out", out], cwd=work, env=_clean_env(venv))
    report = (out / "report.md").read_text()
    assert all(run in report for run in ("own", "hf_trainer", "lightning_job")), done.stdout
    assert list(out.glob("*.png")), "no figure drawn with the lowest matplotlib"


@pytest.mark.parametrize("minor", OTHER_PYTHONS)
def test_the_torch_free_part_runs_on_python(minor, work, wheel, measured):
    python = other_python(minor)
    if python is None:
        pytest.skip(f"no Python {minor} here")
    venv = work / f"py{minor}"
    _run([UV, "venv", "--quiet", "--python", python, venv], cwd=work)
    # the lock's versions where they exist for this Python; 3.10 (which numpy 2.3+ and pandas 3 left) gets
    # what its resolver picks from the ranges, as a user's would
    locked = ["-c", _constraints(work / f"py{minor}-constraints.txt", ())] if minor != "3.10" else []
    _uv_pip(venv, f"{wheel}[plots]", *locked, cwd=work)
    installed = _installed(venv, work)
    assert not {"torch", "ray"} & set(installed)
    env = _clean_env(venv)
    scaling = venv / "bin" / "scaling"
    out = work / f"report-{minor}"
    _run([scaling, "report", measured, "--out", out], cwd=work, env=env)
    assert (out / "report.md").exists() and list(out.glob("*.png"))
    projected = _run(
        [scaling, "project", measured / "runs" / "hf_trainer", "--cluster", "p5.48xlarge", "--gpus", "8,32",
         "--mfu", "0.35", "--json"], cwd=work, env=env,
    )  # fmt: skip
    assert '"num_workers": 32' in projected.stdout
    refused = subprocess.run(
        [scaling, "run", "experiments/quickstart.yaml"], cwd=work, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "pip install 'scaling-lab[lab]'" in refused.stderr


def test_the_wheel_carries_its_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "scaling"
    wanted = [
        *package.glob("projection/presets/*.yaml"),
        *package.glob("projection/layers/*.json"),
        *package.glob("grafana/*.json"),
        package / "devices.yaml",
        package / "integrations" / "_bootstrap" / "sitecustomize.py",
    ]
    assert len(wanted) > 20
    missing = [str(p.relative_to(REPO)) for p in wanted if str(p.relative_to(REPO)) not in names]
    assert missing == []
