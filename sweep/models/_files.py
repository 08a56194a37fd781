"""What a model's files must be before sweep loads them, checked without loading them: a user's own HF directory
(``check_model_files``), a config that builds a decoder-only causal LM (``require_causal_lm``), and never a model's
own code (``NO_REMOTE_CODE``); the errors a load may raise and their one-line form."""

from __future__ import annotations

import struct
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from sweep.config import ModelConfig
from sweep.config.paths import names_a_path
from sweep.errors import InputError

WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model*.bin", "*.safetensors.index.json", "*.bin.index.json")
# what a causal LM's checkpoint names in config.json's architectures; a masked LM or a bare encoder (BertForMaskedLM,
# RobertaModel) has a causal-LM class in transformers too (BertLMHeadModel), but is not one
CAUSAL_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_model_files(mcfg: ModelConfig) -> None:
    """Before any load (a sweep's plan, before Ray starts; a bench's, before its task and model): a local HF
    directory (``model=hf``) that cannot be loaded is one line naming ``model.path`` and what it holds: not a
    directory, no ``config.json``, a config transformers cannot read, a model type that needs the model's own code,
    one that is not a decoder-only causal LM, no weights. A weights file that is not whole, a hub id and the other
    sources are the load's to check."""
    if mcfg.source != "hf" or mcfg.path is None:
        return
    where = f"model.path={mcfg.path}"
    if not mcfg.path.strip():
        raise InputError(f"{where}: empty; model=hf takes model.path=DIR (an HF model directory) or a hub id org/name")
    path = Path(mcfg.path).expanduser()
    if not path.exists():
        if names_a_path(mcfg.path):
            raise InputError(f"{where}: no such directory (and not a hub id of the form org/name)")
        return
    if not path.is_dir():
        raise InputError(
            f"{where}: a file, not a model directory; model=hf takes an HF model directory "
            "(a GGUF file is model=gguf model.path=FILE.gguf)"
        )
    if not (path / "config.json").is_file():
        raise InputError(f"{where}: a directory without config.json (not an HF model directory)")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, **NO_REMOTE_CODE)
    except LOAD_ERRORS as exc:
        if remote_code_asked(exc):
            raise InputError(f"{where}: {REMOTE_CODE}") from exc
        if "does not recognize this architecture" in str(exc):
            raise InputError(
                f"{where}: config.json's model_type is not one transformers {_transformers_version()} knows; sweep "
                "measures the decoder-only causal LMs transformers ships"
            ) from exc
        raise InputError(f"{where}: cannot read its config.json ({type(exc).__name__}: {_short(exc)})") from exc
    require_causal_lm(config, where)
    if not any(any(path.glob(pattern)) for pattern in WEIGHTS):  # (a weights file that is not whole: the load's)
        raise InputError(f"{where}: no weights in this directory (model*.safetensors or pytorch_model*.bin)")


def require_causal_lm(config, where: str) -> None:
    """A config that transformers can build a causal LM for (decoder-only, or a vision-language
    wrapper around one), else one line naming the model type, before any weights are read."""
    from transformers import AutoModelForCausalLM

    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise InputError(
            f"{where}: model_type '{config.model_type}' has no causal-LM class in transformers "
            f"{_transformers_version()}; sweep measures decoder-only causal LMs"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise InputError(
            f"{where}: model_type '{config.model_type}' is an encoder-decoder model; sweep measures decoder-only "
            "causal LMs"
        )
    named = list(getattr(config, "architectures", None) or ())
    if named and not any(name.endswith(CAUSAL_ARCHITECTURES) for name in named):
        raise InputError(
            f"{where}: its weights are a {named[0]} (config.json's architectures), not a causal LM; sweep measures "
            "decoder-only causal LMs"
        )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


# a model's own Python code (config.json's or tokenizer_config.json's auto_map) is never run: transformers' own
# classes only, so a model directory cannot run code in the process that loads it (transformers would otherwise ask
# on a terminal, and run it on a yes)
NO_REMOTE_CODE = {"trust_remote_code": False}
REMOTE_CODE = (
    "its files name Python code of their own (auto_map) for a model type transformers does not ship; sweep does not "
    "run a model's own code (trust_remote_code=False): use a model whose model_type transformers has"
)


def remote_code_asked(exc: BaseException) -> bool:
    """Whether transformers refused a load because it would need the model's own code (trust_remote_code)."""
    return isinstance(exc, ValueError) and "trust_remote_code" in str(exc)


def _short(exc: BaseException) -> str:
    """The first line of ``exc``'s message; a config's validation error says what failed in its cause."""
    if isinstance(exc, StrictDataclassError) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


LOAD_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    IndexError,
    RuntimeError,
    EOFError,
    UnicodeDecodeError,
    struct.error,
    OverflowError,
    MemoryError,
    SafetensorError,
    StrictDataclassError,  # a config transformers' validators refuse (a hidden size no head count divides)
)
