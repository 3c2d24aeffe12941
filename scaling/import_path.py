"""A model, a dataset or a train function named by import path: `package.module:callable`.

    make = load_callable("examples.own_job.vit:tiny_vit", "model.name", required_args=1)

The current working directory is put on `sys.path` first (as `python -m` would), so a user's
package beside the config is found by the `scaling` command too. Every failure (no colon, a
module that does not import, a missing attribute, not callable, the wrong number of required
arguments) is one `UsageError` line naming the config key, before any worker starts.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from scaling.errors import UsageError


def is_import_path(name: str) -> bool:
    return ":" in name


def add_import_root(root: str | None = None) -> None:
    """Put `root` (default: the working directory) first on sys.path, once."""
    root = os.path.abspath(root or os.getcwd())
    if root not in sys.path:
        sys.path.insert(0, root)


def load_callable(path: str, key: str, required_args: int | None = None):
    """The callable `path` names; `required_args`: how many positional arguments it must take."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"{key}={path!r} is not an import path of the form package.module:callable")
    add_import_root()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError, or the module's own error on import
        raise UsageError(f"{key}={path!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{key}={path!r}: {module_name} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{key}={path!r} is not callable ({type(target).__name__})")
    if required_args is not None:
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return target  # a builtin without a signature: let the call tell
        try:
            signature.bind(*([None] * required_args))
        except TypeError:
            raise UsageError(
                f"{key}={path!r} must take {required_args} positional argument(s); its signature is "
                f"{attribute}{signature}"
            ) from None
    return target
