"""Model zoo: plain torch modules selectable by name (see registry.py)."""

from scaling.models.registry import UnknownModelError, build_model, context_length, model_names

__all__ = ["UnknownModelError", "build_model", "context_length", "model_names"]
