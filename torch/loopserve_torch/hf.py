"""Hugging Face Ouro checkpoints (OuroForCausalLM, config.json model_type
"ouro") in PyTorch, without transformers or the safetensors package.

`load_ouro(DIR)` reads config.json and model.safetensors, or the shards a
model.safetensors.index.json names (BF16, F16 or F32), into a float32
LoopedLlama through the name mapping of docs/import-hf.md:
sandwich norms, the step norm and the exit gate. `ouro_end_ids(DIR, vocab)`
reads the ids that end generation. The config is read with the importer's
defaults and refusals (src/model/hf_checkpoint.ts; one table of cases,
torch/tests/hf_config_cases.json, holds both). `write_ouro` writes a
model in that layout (the tests make small checkpoints with it).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct

import numpy as np
import torch

from .model import LIMITS, MAX_LAYERS, MAX_LOOPS, MAX_NORM_EPS, MAX_ROPE_THETA, LoopedConfig, LoopedLlama
from .safetensors_io import ModelFileError, fill_parameters, model_tensors, read_safetensors

# loopserve layer tensor -> Ouro's name under model.layers.<i>.
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "wq": "self_attn.q_proj",
    "wk": "self_attn.k_proj",
    "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj",
    "attn_out_norm": "input_layernorm_2",
    "ffn_norm": "post_attention_layernorm",
    "w1": "mlp.gate_proj",
    "w3": "mlp.up_proj",
    "w2": "mlp.down_proj",
    "ffn_out_norm": "post_attention_layernorm_2",
}


class _Config:
    """Typed values of a config.json, each refusal naming the file and the key, as
    src/model/hf_checkpoint.ts reads them (torch/tests/hf_config_cases.json holds
    the two to the same defaults and refusals)."""

    def __init__(self, d: dict, where: str) -> None:
        self.d, self.where = d, where

    def fail(self, reason: str) -> None:
        raise ModelFileError(f"{self.where}: {reason}")

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def integer(self, key: str, lo: int, hi: int, default: int | None = None) -> int:
        v = self.d.get(key)
        v = default if v is None else v
        if v is None:
            self.fail(f"{key} is required")
        if not _is_int(v) or not lo <= v <= hi:
            self.fail(f"{key} must be an integer in [{lo}, {hi}], got {v!r}")
        return int(v)

    def positive(self, key: str, below: float, default: float) -> float:
        """A positive number below `below`, also once rounded to fp32 (what a model file may hold)."""
        v = self.d.get(key)
        v = default if v is None else v
        with np.errstate(over="ignore"):
            f = float(np.float32(v)) if _is_number(v) else math.nan
        if not (f > 0 and v < below and f < below):
            self.fail(f"{key} must be a positive number below {below:g}, got {v!r}")
        return float(v)

    def boolean(self, key: str, default: bool) -> bool:
        v = self.d.get(key)
        v = default if v is None else v
        if not isinstance(v, bool):
            self.fail(f"{key} must be true or false, got {v!r}")
        return v

    def exit_threshold(self, key: str) -> float | None:
        """The default exit threshold: None when absent, and when 1 (the cumulative
        exit probability reaches 1 only at the last step: every step, fixed depth)."""
        if not self.has(key):
            return None
        v = self.d[key]
        if not _is_number(v):
            self.fail(f"{key} must be a number, got {v!r}")
        if not (math.isfinite(v) and 0 < v <= 1):
            self.fail(f"{key} must be in (0, 1], got {v!r}")
        return None if v == 1 else float(v)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    # JSON's 4.0 is the number 4 to JavaScript: both readers take it.
    return _is_number(v) and math.isfinite(v) and float(v).is_integer()


def _ouro_exit(r: _Config, steps: int) -> tuple[int, float | None]:
    """(default steps, default threshold): early_exit_step k (0-based) takes the
    head's input from step k for every token before any threshold, which is a
    fixed depth of k + 1 (a token's step j attends only to step j of the tokens
    before it); a step outside [0, steps) is refused (docs/import-hf.md#exits)."""
    threshold = r.exit_threshold("early_exit_threshold")
    if not r.has("early_exit_step"):
        return steps, threshold
    k = r.d["early_exit_step"]
    if not _is_int(k) or not 0 <= k < steps:
        r.fail(f"early_exit_step must be an integer in [0, {steps}) (a 0-based step of total_ut_steps {steps}), got {k!r}")
    return int(k) + 1, None


def ouro_config(d: dict, where: str = "config.json") -> LoopedConfig:
    """The LoopedConfig of an Ouro config.json (sandwich, step norm, exit gate), with
    OuroConfig's defaults for the keys it may leave out; what loopserve does not
    compute is refused."""
    archs = d.get("architectures") if isinstance(d.get("architectures"), list) else []
    if d.get("model_type") != "ouro" and "OuroForCausalLM" not in archs:
        raise ModelFileError(f"{where}: unknown architecture (model_type {d.get('model_type')!r}, architectures {archs!r}): an Ouro config is read")
    r = _Config(d, where)
    dim = r.integer("hidden_size", 2, LIMITS["dim"])
    heads = r.integer("num_attention_heads", 1, LIMITS["n_heads"])
    kv = r.integer("num_key_value_heads", 1, LIMITS["n_kv_heads"], heads)
    ffn = r.integer("intermediate_size", 1, LIMITS["ffn_dim"])
    vocab = r.integer("vocab_size", 1, LIMITS["vocab_size"])
    layers = r.integer("num_hidden_layers", 1, MAX_LAYERS)
    loops, threshold = _ouro_exit(r, r.integer("total_ut_steps", 1, MAX_LOOPS, 4))
    max_seq_len = r.integer("max_position_embeddings", 1, LIMITS["max_seq_len"], 32768)
    rope_theta = r.positive("rope_theta", MAX_ROPE_THETA, 10000.0)
    norm_eps = r.positive("rms_norm_eps", MAX_NORM_EPS, 1e-6)
    tied = r.boolean("tie_word_embeddings", False)
    if dim % heads:
        r.fail(f"hidden_size ({dim}) must be a multiple of num_attention_heads ({heads})")
    if (dim // heads) % 2:
        r.fail(f"head_dim = hidden_size / num_attention_heads = {dim // heads} must be even (RoPE rotates pairs)")
    if kv > heads or heads % kv:
        r.fail(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    if r.has("head_dim") and not (_is_number(d["head_dim"]) and d["head_dim"] == dim // heads):
        r.fail(f"head_dim ({d['head_dim']!r}) must equal hidden_size / num_attention_heads = {dim // heads}")
    # What loopserve's kernels do not compute: refused rather than served as another function.
    if r.has("hidden_act") and d["hidden_act"] != "silu":
        r.fail(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
    if d.get("attention_bias") is True:
        r.fail("attention_bias must be false (loopserve's projections have no bias)")
    if r.has("partial_rotary_factor") and not (_is_number(d["partial_rotary_factor"]) and d["partial_rotary_factor"] == 1):
        r.fail(f"partial_rotary_factor must be 1, got {d['partial_rotary_factor']!r}")
    scaling = d.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind != "default":
            r.fail(f"rope_scaling {scaling!r} is not supported (plain RoPE only)")
    layer_types = d.get("layer_types")
    sliding = isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types)
    if d.get("use_sliding_window") is True or sliding:
        r.fail("sliding-window attention is not supported (use_sliding_window / layer_types)")
    return LoopedConfig(
        dim=dim, n_heads=heads, n_kv_heads=kv, ffn_dim=ffn, vocab_size=vocab, default_loops=loops,
        max_seq_len=max_seq_len, rope_theta=rope_theta, norm_eps=norm_eps, tied_output=tied, n_layers=layers,
        norm_layout="sandwich", step_norm=True, exit_gate=True, exit_threshold=threshold,
    )


def _json_object(path: str) -> dict | None:
    """The JSON object in `path`; None when there is no such file."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            v = json.load(f)
    except ValueError as e:
        raise ModelFileError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(v, dict):
        raise ModelFileError(f"{path}: must be a JSON object")
    return v


def _token_id(tokenizer: dict, text: str) -> int | None:
    """A token's id by its text: tokenizer.json's added_tokens first, then the model's vocabulary."""
    for a in tokenizer.get("added_tokens") or []:
        if isinstance(a, dict) and a.get("content") == text and _is_int(a.get("id")):
            return int(a["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    return int(vocab[text]) if isinstance(vocab, dict) and _is_int(vocab.get(text)) else None


def ouro_end_ids(directory: str, vocab_size: int) -> list[int]:
    """The ids that end generation, in order, each once: config.json's eos_token_id (a
    number or a list), generation_config.json's, then the id of tokenizer_config.json's
    eos_token. A value that is no id of the vocabulary is refused naming the file and key."""
    ids: list[int] = []

    def add(v: object, path: str, key: str) -> None:
        if not _is_int(v) or not 0 <= v < vocab_size:
            raise ModelFileError(f"{path}: {key} must be a token id in [0, {vocab_size}), got {v!r}")
        if int(v) not in ids:
            ids.append(int(v))

    for name in ("config.json", "generation_config.json"):
        path = os.path.join(directory, name)
        e = (_json_object(path) or {}).get("eos_token_id")
        if isinstance(e, list):
            for i, v in enumerate(e):
                add(v, path, f"eos_token_id[{i}]")
        elif e is not None:
            add(e, path, "eos_token_id")
    config_path = os.path.join(directory, "tokenizer_config.json")
    eos = (_json_object(config_path) or {}).get("eos_token")
    if eos is not None:
        text = eos if isinstance(eos, str) else eos.get("content") if isinstance(eos, dict) else None
        if not isinstance(text, str):
            raise ModelFileError(f"{config_path}: eos_token must be a token's text or an object with its \"content\", got {eos!r}")
        tokenizer = _json_object(os.path.join(directory, "tokenizer.json"))
        token = None if tokenizer is None else _token_id(tokenizer, text)
        if token is None:
            raise ModelFileError(f"{config_path}: eos_token {text!r} is not a token of tokenizer.json")
        add(token, config_path, f"the id of eos_token {text!r}")
    return ids


# loopserve's model-wide tensors -> Ouro's names.
GLOBAL_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "exit_gate.weight": "model.early_exit_gate.weight",
    "exit_gate.bias": "model.early_exit_gate.bias",
}


def ouro_name(name: str) -> str:
    """Ouro's name of a loopserve tensor name (`block.` or `layers.<i>.` prefixes for layers)."""
    m = re.fullmatch(r"(?:block|layers\.(\d+))\.(\w+)\.weight", name)
    return f"model.layers.{m[1] or 0}.{LAYER_NAMES[m[2]]}.weight" if m else GLOBAL_NAMES[name]


def ouro_names(model: LoopedLlama) -> list[tuple[str, torch.Tensor]]:
    """(Ouro tensor name, parameter) for every parameter of `model`, in loopserve's order."""
    return [(ouro_name(n), t) for n, t in model_tensors(model)]


def _read_tensors(directory: str) -> dict[str, np.ndarray]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelFileError(f"{index}: no weight_map")
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            path = os.path.join(directory, shard)
            if not os.path.exists(path):
                raise ModelFileError(f"{index}: shard {shard!r} is missing")
            _, part = read_safetensors(path)
            for name, arr in part.items():
                if weight_map.get(name) == shard:
                    tensors[name] = arr
        absent = sorted(n for n in weight_map if n not in tensors)
        if absent:
            raise ModelFileError(f"{index}: tensor {absent[0]!r} is not in its shard {weight_map[absent[0]]!r}")
        return tensors
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise ModelFileError(f"{directory}: neither model.safetensors nor model.safetensors.index.json")
    return read_safetensors(single)[1]


def load_ouro(directory: str) -> LoopedLlama:
    """A Hugging Face Ouro checkpoint directory as a float32 LoopedLlama (eval mode)."""
    config_path = os.path.join(directory, "config.json")
    d = _json_object(config_path)
    if d is None:
        raise ModelFileError(f"{directory}: config.json is missing")
    config = ouro_config(d, config_path)
    tensors = _read_tensors(directory)
    # Tied when the config says so (a stored lm_head.weight is then a copy, not read,
    # as transformers ties it) or when the checkpoint has no head.
    if "lm_head.weight" not in tensors:
        config.tied_output = True
    model = LoopedLlama(config)
    fill_parameters(ouro_names(model), tensors, directory)
    ignorable = {"lm_head.weight"} if config.tied_output else set()
    extra = sorted(n for n in set(tensors) - {n for n, _ in ouro_names(model)} - ignorable if not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ModelFileError(f"{directory}: unexpected tensor {extra[0]!r} ({len(extra)} unexpected in all)")
    return model.eval()


def write_safetensors(path: str, tensors: list[tuple[str, str, np.ndarray]], metadata: dict[str, str] | None = None) -> None:
    """A plain safetensors file of (name, dtype "BF16" | "F16" | "F32", array)."""
    header: dict = {"__metadata__": metadata or {}}
    blobs, offset = [], 0
    for name, dtype, arr in tensors:
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * ((-len(head)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def _as(t: torch.Tensor, dtype: str) -> np.ndarray:
    t = t.detach().cpu()
    if dtype == "BF16":  # the top 16 bits of the fp32 after PyTorch's round-to-nearest-even
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return t.to(torch.float16 if dtype == "F16" else torch.float32).numpy()


def write_ouro(model: LoopedLlama, directory: str, dtype: str = "BF16", shards: int = 1) -> None:
    """Writes `model` (sandwich, step norm, exit gate) as an Ouro checkpoint: config.json and
    model.safetensors, or `shards` files with model.safetensors.index.json."""
    c = model.config
    if not (c.norm_layout == "sandwich" and c.step_norm and c.exit_gate):
        raise ValueError("an Ouro checkpoint has sandwich norms, the step norm and the exit gate")
    os.makedirs(directory, exist_ok=True)
    config = {
        "architectures": ["OuroForCausalLM"], "model_type": "ouro", "hidden_size": c.dim,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
        "intermediate_size": c.ffn_dim, "vocab_size": c.vocab_size, "num_hidden_layers": c.n_layers,
        "total_ut_steps": c.default_loops, "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_seq_len, "tie_word_embeddings": c.tied_output, "hidden_act": "silu",
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
    }
    if c.exit_threshold is not None:
        config["early_exit_threshold"] = c.exit_threshold
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    named = [(n, dtype, _as(p, dtype)) for n, p in ouro_names(model)]
    if shards <= 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), named, {"format": "pt"})
        return
    per = -(-len(named) // shards)
    weight_map = {}
    for k in range(shards):
        part = named[k * per : (k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(directory, fname), part, {"format": "pt"})
        weight_map.update({n: fname for n, _, _ in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


def load_any(path: str) -> LoopedLlama:
    """A loopserve model file, or a Hugging Face Ouro checkpoint directory."""
    if os.path.isdir(path):
        return load_ouro(path)
    from .safetensors_io import load  # noqa: PLC0415

    return load(path)
