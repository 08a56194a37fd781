"""Model loading, the adapter that finds a model's parts, and the fidelity check at load."""

from sweep.models._adapter import KINDS, Adapter, StepExit
from sweep.models._fidelity import Fidelity
from sweep.models._loader import DTYPES, LoadedModel, ModelCache, load_model, model_loads, ready, resolve_device
from sweep.models._padding import PAD_ID, Padded, left_pad
from sweep.models._shape import Shape, shape_before_load
from sweep.models._files import check_model_files
from sweep.models._sources import cache_dir
from sweep.models._table import family_rows
from sweep.models._table import markdown as family_table
from sweep.models._tiny import byte_tokenizer

__all__ = [
    "Adapter",
    "DTYPES",
    "Fidelity",
    "KINDS",
    "LoadedModel",
    "ModelCache",
    "PAD_ID",
    "Padded",
    "Shape",
    "StepExit",
    "byte_tokenizer",
    "cache_dir",
    "check_model_files",
    "family_rows",
    "family_table",
    "left_pad",
    "load_model",
    "model_loads",
    "ready",
    "resolve_device",
    "shape_before_load",
]
