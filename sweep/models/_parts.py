"""A decoder-only LM's parts, found from its structure rather than its family's attribute names.

- the decoder layers: the ``ModuleList`` of ``num_hidden_layers`` blocks (of the text config in a
  vision-language wrapper), the one nearest the decoder's root outside any vision or audio tower;
- the final norm: the norm module beside that list (a direct child of the module that holds it);
- the output head: ``get_output_embeddings()``;
- the logit transforms a config key names (``sweep.config.families.HEAD_SCALES``);
- the embedding scale needs nothing: h_0 is taken at the first layer's input (``Adapter.capture_hidden``).

What is found is checked at load (``sweep.models._fidelity``): the lens at layer L must give
the model's own logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sweep.errors import InputError
from sweep.config.families import HEAD_OVERRIDES, HEAD_SCALES, HeadScale

_TOWERS = ("vision", "visual", "audio", "image", "encoder", "speech", "mm_projector", "multi_modal")


@dataclass(frozen=True)
class Parts:
    """Where a model keeps what the engine touches."""

    decoder: torch.nn.Module  # the module whose forward runs the layers (holds the final norm)
    layers: torch.nn.ModuleList
    layers_path: str  # dotted path of the layer list from the model (for messages)
    norm: torch.nn.Module  # the final norm (torch.nn.Identity when the model has none)
    head: torch.nn.Module  # the output embeddings
    scales: tuple[tuple[HeadScale, float], ...]  # logit transforms with their values


def text_config(model: torch.nn.Module):
    """The config of the decoder (a vision-language wrapper keeps it in ``text_config``)."""
    return model.config.get_text_config(decoder=True)


def find_parts(model: torch.nn.Module, *, where: str) -> Parts:
    """The parts of ``model``, or a one-line refusal saying which could not be found."""
    cfg = text_config(model)
    n_layers = getattr(cfg, "num_hidden_layers", None)
    if not isinstance(n_layers, int) or n_layers < 1:
        raise InputError(f"{where}: the config of model_type '{cfg.model_type}' names no num_hidden_layers")
    root = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else model
    path, layers = _layer_list(root, n_layers) or _layer_list(model, n_layers) or (None, None)
    if layers is None:
        raise InputError(
            f"{where}: found no list of {n_layers} decoder layers in {type(model).__name__} (model_type "
            f"'{model.config.model_type}'); only decoder-only causal LMs are supported"
        )
    decoder = _parent(model, _path_from(model, layers))
    head = model.get_output_embeddings()
    if head is None:
        raise InputError(f"{where}: {type(model).__name__} has no output embeddings (get_output_embeddings)")
    return Parts(decoder, layers, _path_from(model, layers), _final_norm(decoder, layers), head, _scales(model))


def _layer_list(root: torch.nn.Module, n_layers: int):
    """(path, list) of the shallowest ModuleList of ``n_layers`` modules below ``root``, outside towers."""
    found = [
        (name, module)
        for name, module in root.named_modules()
        if isinstance(module, torch.nn.ModuleList)
        and len(module) == n_layers
        and not any(t in name.lower() for t in _TOWERS)
        and all(sum(1 for _ in m.parameters()) > 0 for m in module)
    ]
    if not found:
        return None
    return min(found, key=lambda nm: nm[0].count("."))


def _path_from(model: torch.nn.Module, target: torch.nn.Module) -> str:
    return next(name for name, module in model.named_modules() if module is target)


def _parent(model: torch.nn.Module, path: str) -> torch.nn.Module:
    return model.get_submodule(path.rpartition(".")[0]) if "." in path else model


def _is_norm(module: torch.nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() or isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm))


def _final_norm(decoder: torch.nn.Module, layers: torch.nn.ModuleList) -> torch.nn.Module:
    """The norm the decoder applies after its last layer: its one direct child that is a norm (a
    model without one gets the identity; the fidelity check says whether the lens is right)."""
    norms = [m for name, m in decoder.named_children() if m is not layers and _is_norm(m)]
    if len(norms) > 1:  # several norms beside the layers: the one named as a final norm
        named = dict(decoder.named_children())
        for name in ("norm", "norm_f", "ln_f", "final_layernorm", "final_layer_norm", "final_norm"):
            if name in named:
                return named[name]
    return norms[0] if norms else torch.nn.Identity()


def _scales(model: torch.nn.Module) -> tuple[tuple[HeadScale, float], ...]:
    """The logit transforms this model's config names, with their values (unset ones left out)."""
    cfgs = [text_config(model), model.config]
    table = HEAD_OVERRIDES.get(text_config(model).model_type, HEAD_SCALES)
    out = []
    for scale in table:
        value = next((getattr(c, scale.key) for c in cfgs if getattr(c, scale.key, None) is not None), None)
        if value is not None and not (scale.op in ("divide", "multiply") and float(value) == 1.0):
            out.append((scale, float(value)))
    return tuple(out)


def apply_scales(z: torch.Tensor, scales: tuple[tuple[HeadScale, float], ...]) -> torch.Tensor:
    """The model's own logit transforms applied to its head's output ``z``."""
    for scale, value in scales:
        if scale.op == "divide":
            z = z / value
        elif scale.op == "multiply":
            z = z * value
        else:  # softcap
            z = torch.tanh(z / value) * value
    return z
