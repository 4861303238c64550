"""The tiny model must load in vLLM on CPU and be byte-stable, or deploys restart (or break) for nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from fleetlab import tinymodel
from fleetlab.tinymodel import make_tiny_model, tensor_shapes

REPO = Path(__file__).resolve().parents[2]
# Head sizes vLLM's CPU attention backend accepts; anything else starts but breaks completions.
CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}


def _hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_writes_expected_files_small(model_dir: Path) -> None:
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(tinymodel.FILE_NAMES)
    assert sum(p.stat().st_size for p in model_dir.iterdir()) < 4 * 1024 * 1024
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")], "temp dir left behind"


def test_deterministic_across_processes(model_dir: Path, tmp_path: Path) -> None:
    # Separate processes: Rust HashMaps in the tokenizer trainer get a fresh random state in each one.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "fleetlab.tinymodel", str(tmp_path / name)], check=True,
                       env=env, cwd=tmp_path, capture_output=True)
    assert _hashes(tmp_path / "a") == _hashes(tmp_path / "b") == _hashes(model_dir)


def test_seed_changes_weights_only(model_dir: Path, tmp_path: Path) -> None:
    other = _hashes(make_tiny_model(tmp_path / "s1", seed=1))
    base = _hashes(model_dir)
    assert {k for k in base if base[k] != other[k]} == {"model.safetensors"}


def test_shapes_match_config(model_dir: Path, config: dict) -> None:
    tensors = load_file(model_dir / "model.safetensors")
    expected = tensor_shapes(config)
    assert {k: v.shape for k, v in tensors.items()} == expected
    assert "model.layers.1.self_attn.k_proj.weight" in expected and "lm_head.weight" in expected
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (
        config["num_key_value_heads"] * config["head_dim"], config["hidden_size"])
    assert tensors["model.norm.weight"].min() == tensors["model.norm.weight"].max() == 1.0
    assert all(str(t.dtype) == config["torch_dtype"] for t in tensors.values())
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert 0.015 < float(q.std()) < 0.025


def test_config_is_llama_gqa(config: dict) -> None:
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["tie_word_embeddings"] is False


def test_head_dim_supported_by_vllm_cpu(config: dict) -> None:
    assert config["head_dim"] in CPU_HEAD_SIZES
    assert config["head_dim"] * config["num_attention_heads"] == config["hidden_size"]


def test_vocab_size_equals_tokenizer(model_dir: Path, config: dict) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert config["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
    assert 512 <= config["vocab_size"] <= 1000
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    gen = json.loads((model_dir / "generation_config.json").read_text())
    for key in ("bos", "eos", "pad"):
        tid = tok.token_to_id(tok_config[f"{key}_token"])
        assert tid == config[f"{key}_token_id"] == gen[f"{key}_token_id"]


@pytest.mark.parametrize("text", ["Hello, how are you today? The weather is good.", "Ünïcödé ✓ 42\ttabs\n"])
def test_tokenizer_round_trips(model_dir: Path, text: str) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    enc = tok.encode(text)
    assert enc.ids[0] == tok.token_to_id("<s>")
    assert tok.token_to_id("<unk>") not in enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=True) == text


def test_chat_template_renders(model_dir: Path) -> None:
    jinja2 = pytest.importorskip("jinja2")
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    out = jinja2.Template(tok_config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True,
        bos_token=tok_config["bos_token"], eos_token=tok_config["eos_token"])
    assert out == "<s><|user|>\nhi</s>\n<|assistant|>\n"


def test_rerun_leaves_files_untouched(tmp_path: Path) -> None:
    dest = make_tiny_model(tmp_path / "m")
    old = 1_000_000_000
    for p in dest.iterdir():
        os.utime(p, (old, old))
    dir_ino = dest.stat().st_ino
    assert tinymodel.main([str(dest)]) == 0
    assert dest.stat().st_ino == dir_ino
    assert all(p.stat().st_mtime == old for p in dest.iterdir())


def test_changed_content_is_replaced(tmp_path: Path) -> None:
    dest = make_tiny_model(tmp_path / "m")
    good = _hashes(dest)
    (dest / "config.json").write_text("{}")
    (dest / "tokenizer.json").unlink()
    make_tiny_model(dest)
    assert _hashes(dest) == good
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "temp or backup dir left behind"


def test_refuses_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        make_tiny_model(tmp_path)
    assert tinymodel.main([str(tmp_path)]) == 1
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_loads_with_transformers(model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert len(tok) == model.config.vocab_size
    ids = tok("Hello there", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4
