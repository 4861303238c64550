"""A tiny Llama-architecture model, written locally, for smoke tests and the lab.

Why it exists
-------------
The lab hosts and CI have no route to the Hugging Face hub (downloads are forbidden), yet a real vLLM
server needs a real model directory to start, answer /v1/completions and /v1/chat/completions, and be
rolled out. This module writes one from nothing but numpy, safetensors and tokenizers: no hub, no torch.

Design constraints, each learned the hard way
---------------------------------------------
* head_dim is 32. vLLM's CPU attention backend only supports head sizes 32, 64, 80, 96, 112, 128, 160,
  192, 224, 256 and 512; with 16 the server starts but completions break.
* vocab_size in config.json is exactly the tokenizer's vocabulary size (special tokens included). A
  larger embedding lets the model sample ids the tokenizer cannot decode, and completions come back "".
* num_key_value_heads (2) < num_attention_heads (4), so tensor-parallel rules see a GQA model.
* Output is byte-for-byte deterministic for a given seed: the deploy stages these files to hosts and
  restarts vLLM only when they change. Weights come from ``numpy.random.default_rng(seed)`` drawn in a
  fixed order; JSON is written with sorted keys and fixed separators; the BPE tokenizer is trained on a
  fixed corpus embedded below (the trainer breaks ties between equally frequent pairs by the pair itself,
  so its merges do not depend on hash order; the tests check this across processes).
* Writes are atomic at the directory level: the new tree is built in a temp dir beside DEST and renamed
  into place, and a DEST that already holds the same bytes is left untouched (mtimes included).

Usage: ``python -m fleetlab.tinymodel DEST [--seed N]``. Float32 weights, about 2 MB in all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HIDDEN_SIZE = 128
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 32
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 2048
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5
INIT_STD = 0.02
# A target for the trainer; the real size (what config.json gets) is read back from the tokenizer.
VOCAB_TARGET = 768

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD]  # ids 0..3, Llama's order for the first three

# Role markers are plain text so the template needs no extra special tokens; bos/eos come from the tokenizer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Ordinary English so the merges look like words and a test sentence round-trips in few tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model is enough to prove that a server starts,
loads its weights, and answers a request. It does not need to be clever; it needs to be there, on every
host, with the same bytes, so that a rollout can tell what changed and what did not.

Once upon a time there was a little town by the sea. Every morning the people walked to the market to buy
bread, fish, apples and cheese. The children played in the streets and the old men sat in the sun, talking
about the weather, the boats, and the news from the city far away.

Hello, how are you today? I am fine, thank you. What would you like to do this afternoon? We could read a
book, write a letter, or go for a walk in the park. The weather is good and the sky is clear and blue.

Computers follow instructions written by people. A program reads some input, does some work, and writes
some output. When the program is wrong, the computer does exactly what it was told, which is not always
what the person wanted. Testing helps us find those mistakes before our users do.

The history of the world is long and full of surprises. Kings and queens came and went, cities rose and
fell, and new ideas changed the way people lived and worked. Music, art and science grew together, and
each generation learned from the one before it.

Please answer the question in one short sentence. The answer is yes. The answer is no. Maybe tomorrow.
One, two, three, four, five, six, seven, eight, nine, ten. Monday, Tuesday, Wednesday, Thursday, Friday.
"""
CORPUS_REPEATS = 8  # every pair reaches min_frequency; more repeats add no new merges, only time

FILE_NAMES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _json_bytes(obj: Any) -> bytes:
    """Serialize so that equal objects give equal bytes, whatever the dict insertion order."""
    text = json.dumps(obj, sort_keys=True, indent=2, separators=(",", ": "), ensure_ascii=True)
    return (text + "\n").encode()


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE: any text (any UTF-8 byte) encodes without <unk>, and decoding is lossless."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines * CORPUS_REPEATS, trainer=trainer)
    # Llama convention: a BOS in front when special tokens are requested (completions); chat templates
    # carry their own bos_token and vLLM tokenizes them without special tokens.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A:0",
        pair=f"{BOS} $A:0 $B:1",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
    )
    return tokenizer


def model_config(vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    """The config.json that transformers and vLLM read to build LlamaForCausalLM."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor LlamaForCausalLM loads, in a fixed order (the order the RNG draws them in)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (hidden,)
        shapes[f"{p}.self_attn.q_proj.weight"] = (q_out, hidden)
        shapes[f"{p}.self_attn.k_proj.weight"] = (kv_out, hidden)
        shapes[f"{p}.self_attn.v_proj.weight"] = (kv_out, hidden)
        shapes[f"{p}.self_attn.o_proj.weight"] = (hidden, q_out)
        shapes[f"{p}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{p}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{p}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{p}.mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def make_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random normal matrices and all-ones norms: garbage text, but numerically tame (no NaN/inf)."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes(config).items():
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) * INIT_STD).astype(np.float32)
    return weights


def build_files(seed: int = 0) -> dict[str, bytes]:
    """The whole model directory in memory, so DEST can be compared before anything is written."""
    tokenizer = train_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    config = model_config(vocab_size, ids[BOS], ids[EOS], ids[PAD])
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    tokenizer_config = {
        **special_map,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[tok]): {
                "content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True,
            }
            for tok in SPECIAL_TOKENS
        },
    }
    generation_config = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}
    return {
        "config.json": _json_bytes(config),
        "generation_config.json": _json_bytes(generation_config),
        # save() is save_file() without the file: same bytes, but comparable before touching DEST.
        "model.safetensors": safetensors.numpy.save(make_weights(config, seed), metadata={"format": "pt"}),
        "special_tokens_map.json": _json_bytes(special_map),
        "tokenizer.json": (tokenizer.to_str(pretty=True) + "\n").encode(),
        "tokenizer_config.json": _json_bytes(tokenizer_config),
    }


def _holds(dest: Path, files: dict[str, bytes]) -> bool:
    """True when DEST has exactly these files with these bytes, so a rerun can leave it (and mtimes) be."""
    if not dest.is_dir() or {p.name for p in dest.iterdir()} != set(files):
        return False
    return all((dest / name).is_file() and (dest / name).read_bytes() == data for name, data in files.items())


def make_tiny_model(dest: Path, *, seed: int = 0) -> Path:
    """Write the tiny model into DEST and return DEST; a no-op when DEST already holds the same bytes.

    Replacing is a rename of a fully written temp dir, so a reader never sees a half-written model (only,
    for an instant between two renames, no DEST when an old one is swapped out). DEST is
    refused if it holds anything but our files, so a typo'd path cannot wipe an unrelated directory.
    """
    dest = Path(dest).absolute()
    files = build_files(seed)
    if _holds(dest, files):
        return dest
    if dest.exists():
        if not dest.is_dir():
            raise FileExistsError(f"{dest} exists and is not a directory")
        foreign = sorted(p.name for p in dest.iterdir() if p.name not in files)
        if foreign:
            raise FileExistsError(f"{dest} holds files that are not the tiny model's: {', '.join(foreign)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the model dir is read by the vLLM service user
        if dest.exists():
            # Directories cannot be replaced over a non-empty target: move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.rename(dest, old / dest.name)
            try:
                os.rename(tmp, dest)
            except OSError:
                os.rename(old / dest.name, dest)
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: ``python -m fleetlab.tinymodel DEST [--seed N]``; prints DEST."""
    parser = argparse.ArgumentParser(prog="python -m fleetlab.tinymodel", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed for the weights (default 0)")
    args = parser.parse_args(argv)
    try:
        print(make_tiny_model(args.dest, seed=args.seed))
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
