"""Model loading and family adapters."""

from sweep.models._adapter import Adapter
from sweep.models._loader import DTYPES, LoadedModel, load_model, model_loads, resolve_device
from sweep.families import FAMILIES, Family, family_for

__all__ = [
    "Adapter",
    "DTYPES",
    "FAMILIES",
    "Family",
    "LoadedModel",
    "family_for",
    "load_model",
    "model_loads",
    "resolve_device",
]
