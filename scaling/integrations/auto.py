"""The trainers' callbacks attached without a line of the job changed: `scaling attach -- CMD`.

    scaling attach --out results/my-job/w2 -- torchrun --nproc_per_node 2 train.py

`scaling attach` (scaling/cli.py) runs CMD with `_bootstrap/` first on PYTHONPATH and the run
directory in `SCALING_ATTACH_RUN_DIR`. Every Python process CMD starts (torchrun's workers inherit the
environment) then runs `_bootstrap/sitecustomize.py` at start-up, which calls `install_from_environment`:
an import hook that waits for the trainers' modules and, once one is imported, wraps its Trainer's
constructor so that each Trainer built gets the trainer's own `ScalingCallback` (hf.py, lightning.py),
unless the job already added one. Nothing else of the job is touched: a process that never builds a
Trainer is not measured (`scaling attach` then says so).

The sitecustomize shadows the environment's own one on PYTHONPATH; it runs that one after itself
(conda and Debian ship one), so the job starts as it would without the lab.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

RUN_DIR_ENV = "SCALING_ATTACH_RUN_DIR"
TARGET_LOSS_ENV = "SCALING_ATTACH_TARGET_LOSS"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def _settings() -> dict:
    target = os.environ.get(TARGET_LOSS_ENV)
    return {"target_loss": float(target) if target else None}


def _add_hf_callback(module) -> None:
    """transformers.trainer imported: each Trainer built adds the HF callback."""
    trainer_init = module.Trainer.__init__

    def init_with_callback(self, *args, **kwargs):
        trainer_init(self, *args, **kwargs)
        from scaling.integrations.hf import ScalingCallback

        if not any(isinstance(cb, ScalingCallback) for cb in self.callback_handler.callbacks):
            self.add_callback(ScalingCallback(os.environ[RUN_DIR_ENV], **_settings()))

    module.Trainer.__init__ = init_with_callback


def _add_lightning_callback(module) -> None:
    """lightning.pytorch's Trainer module imported: each Trainer built gets the Lightning callback."""
    trainer_init = module.Trainer.__init__

    def init_with_callback(self, *args, **kwargs):
        from scaling.integrations.lightning import ScalingCallback

        callbacks = kwargs.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if not any(isinstance(cb, ScalingCallback) for cb in callbacks):
            callbacks.append(ScalingCallback(os.environ[RUN_DIR_ENV], **_settings()))
        trainer_init(self, *args, **{**kwargs, "callbacks": callbacks})

    module.Trainer.__init__ = init_with_callback


# module -> what to do once it has been executed
AFTER_IMPORT = {
    "transformers.trainer": _add_hf_callback,
    "lightning.pytorch.trainer.trainer": _add_lightning_callback,
}


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules of AFTER_IMPORT, the spec the other finders give, with
    its loader wrapped so that the patch runs once the module has been executed."""

    def find_spec(self, name, path, target=None):
        patch = AFTER_IMPORT.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install_from_environment() -> bool:
    """Install the import hook when `scaling attach` started this process (its run directory is in
    the environment); True when installed."""
    if not os.environ.get(RUN_DIR_ENV):
        return False
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
    for name, patch in AFTER_IMPORT.items():  # imported before this ran (not at start-up): patch now
        if name in sys.modules:
            patch(sys.modules[name])
    return True


def run_shadowed_sitecustomize() -> None:
    """Run the `sitecustomize` that `_bootstrap/` shadows on sys.path, if the environment has one."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != BOOTSTRAP_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def environment(run_dir: str, target_loss: float | None) -> dict:
    """The environment `scaling attach` runs its command in: os.environ, the bootstrap first on
    PYTHONPATH, the run directory and settings."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *filter(None, [env.get("PYTHONPATH")])])
    env[RUN_DIR_ENV] = run_dir
    if target_loss is not None:
        env[TARGET_LOSS_ENV] = repr(target_loss)
    else:
        env.pop(TARGET_LOSS_ENV, None)
    return env
