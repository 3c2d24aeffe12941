"""Host syncs in the lab's training step on GPU, found with torch.cuda's sync debug mode.

On GPU the host queues work and runs ahead of the device; a host sync (a `.item()`, a copy
from pageable memory, a `nonzero`, ...) makes it wait until the device has drained, and the
next step's work is then queued late: the GPU idles. Once per epoch that is harmless; once
per step it costs throughput and bends the phase marks. The lab's loop means to make one per
step (fp16 only): GradScaler reads its found-inf flag on the host to decide whether to step
(`Precision.step`). Everything else per step is a bug.

`capture_host_syncs()` turns `torch.cuda.set_sync_debug_mode("warn")` on for a block of code
and records, for every "called a synchronizing CUDA operation" warning, the stack that made it
(the autograd engine replays warnings of backward's threads in the thread that called
backward, so backward's syncs are caught too). `Syncs.sites()` groups them by call site (the
innermost frame of the lab's code, and the innermost frame of all) and names the phase of the
lab's loop it came from (training step, evaluation, calibration, epoch end).

`audit_lab_loop(cfg, device, run_dir)` runs the lab's own loop (`run_worker`) in this process
on one GPU, world size 1, under the capture, and returns the sites; `per_step_syncs` keeps
those of the training step that fired more often than once per epoch, each marked intended
(GradScaler's) or not. tests/test_gpu_path.py and scripts/gpu_first_contact.py run it where
CUDA exists. On a machine without CUDA the sync debug mode does not exist: the capture says so
(`Syncs.available`) and records nothing.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

SYNC_MESSAGE = "called a synchronizing CUDA operation"
# Innermost frames of the syncs the loop makes on purpose, with why.
INTENDED = {
    "torch/amp/grad_scaler.py": "GradScaler reads found_inf on the host to skip the step on overflow (fp16)",
}
# The lab's functions that say which part of the loop a sync came from (innermost first wins).
PHASES = (
    ("_evaluate", "evaluation"),
    ("calibrate", "calibration"),  # calibration.py CalibrationWindow.calibrate
    ("end_epoch", "epoch end"),
    ("_profile_compute", "epoch end"),
    ("train_worker", "training step"),
)
_LAB_ROOT = str(Path(__file__).resolve().parents[1])  # .../scaling


def _where(frame: traceback.FrameSummary) -> str:
    path = frame.filename
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        if path.startswith(_LAB_ROOT):
            path = "scaling" + path[len(_LAB_ROOT) :]
    return f"{path}:{frame.lineno} ({frame.name}: {(frame.line or '').strip()})"


@dataclass
class Syncs:
    """The host syncs seen inside `capture_host_syncs()`; `available` False where CUDA is absent."""

    available: bool = True
    reason: str = ""
    stacks: list[list[traceback.FrameSummary]] = field(default_factory=list)
    # how many syncs came before the first training forward: the loop's set-up (the model and the
    # dataset moved to the GPU, once), not its training step; None: not marked, none set apart
    setup_syncs: int | None = None

    def sites(self) -> list[dict]:
        """One row per call site: where, the phase of the loop, how many times, intended or not."""
        rows: dict[tuple, dict] = {}
        for index, stack in enumerate(self.stacks):
            frames = [f for f in stack if "warnings.py" not in f.filename and not f.filename.endswith("sync_audit.py")]
            if not frames:
                continue
            innermost = frames[-1]
            lab = next((f for f in reversed(frames) if f.filename.startswith(_LAB_ROOT)), None)
            names = [f.name for f in reversed(frames) if f.filename.startswith(_LAB_ROOT)]
            phase = next((label for name in names for fn, label in PHASES if name == fn), "other")
            if phase == "training step" and self.setup_syncs is not None and index < self.setup_syncs:
                phase = "setup"
            intended = next((why for path, why in INTENDED.items() if innermost.filename.endswith(path)), None)
            key = (_where(innermost), _where(lab) if lab else None, phase)
            row = rows.setdefault(
                key, {"site": key[0], "lab_site": key[1], "phase": phase, "count": 0, "intended": intended}
            )
            row["count"] += 1
        return sorted(rows.values(), key=lambda r: -r["count"])


@contextlib.contextmanager
def capture_host_syncs():
    """Record every host sync of the block (module docstring); yields a `Syncs`."""
    syncs = Syncs()
    if not torch.cuda.is_available():
        syncs.available, syncs.reason = False, "torch.cuda's sync debug mode needs CUDA; none here"
        yield syncs
        return
    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_MESSAGE)
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if SYNC_MESSAGE in str(message):
                syncs.stacks.append(traceback.extract_stack()[:-1])
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield syncs
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)
            warnings.showwarning = shown


def per_step_syncs(sites: list[dict], epochs: int) -> list[dict]:
    """The sites of the training step that fired more often than once per epoch."""
    return [s for s in sites if s["phase"] == "training step" and s["count"] > epochs]


def audit_lab_loop(cfg, device: torch.device, run_dir) -> dict:
    """Run the lab's loop for `cfg` on `device` (world size 1, this process) under the capture.

    Returns {"available", "reason", "epochs", "sites", "per_step", "unintended_per_step"}:
    `unintended_per_step` empty is the pass.
    """
    from scaling.train.loop import WorkerContext, run_worker

    if cfg.workers.num_workers != 1:
        raise ValueError("audit_lab_loop runs one worker in this process: set workers.num_workers=1")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = WorkerContext(rank=0, world_size=1, local_rank=0, node_rank=0, device=device)
    Path(run_dir).mkdir(parents=True, exist_ok=True)

    def mark_first_forward(module, args):
        if syncs.setup_syncs is None:
            syncs.setup_syncs = len(syncs.stacks)

    with capture_host_syncs() as syncs:
        first_forward = torch.nn.modules.module.register_module_forward_pre_hook(mark_first_forward)
        try:
            row = run_worker(cfg, ctx, Path(run_dir))
        finally:
            first_forward.remove()
    epochs = int(row.get("epoch", cfg.train.max_epochs)) if row else cfg.train.max_epochs
    sites = syncs.sites()
    per_step = per_step_syncs(sites, epochs)
    return {
        "available": syncs.available,
        "reason": syncs.reason,
        "epochs": epochs,
        "sites": sites,
        "per_step": per_step,
        "unintended_per_step": [s for s in per_step if not s["intended"]],
    }
