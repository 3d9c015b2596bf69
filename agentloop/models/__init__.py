"""The models built here: the tiny text and VLM models, ``tiny-calc``, the calc caller, by name."""

from agentloop.models.names import MODEL_NAMES, resolve_model, resolve_model_path

__all__ = ["MODEL_NAMES", "resolve_model", "resolve_model_path"]
