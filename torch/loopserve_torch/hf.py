"""Hugging Face Ouro checkpoints (OuroForCausalLM, config.json model_type
"ouro") in PyTorch, without transformers or the safetensors package.

`load_ouro(DIR)` reads config.json and model.safetensors, or the shards a
model.safetensors.index.json names (BF16, F16 or F32), into a float32
LoopedLlama through the name mapping of docs/import-hf.md:
sandwich norms, the step norm and the exit gate. `write_ouro` writes a
model in that layout (the tests make small checkpoints with it).
"""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import torch

from .model import LoopedConfig, LoopedLlama
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


def ouro_config(d: dict, where: str = "config.json") -> LoopedConfig:
    """The LoopedConfig of an Ouro config.json (sandwich, step norm, exit gate)."""
    if d.get("model_type") != "ouro":
        raise ModelFileError(f"{where}: model_type must be 'ouro', got {d.get('model_type')!r}")
    if d.get("rope_scaling"):
        raise ModelFileError(f"{where}: rope_scaling {d['rope_scaling']!r} is not served (plain RoPE only)")
    need = ["hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers", "total_ut_steps"]
    missing = [k for k in need if k not in d]
    if missing:
        raise ModelFileError(f"{where}: missing {missing[0]!r}")
    dim, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
    if "head_dim" in d and d["head_dim"] is not None and int(d["head_dim"]) * heads != dim:
        raise ModelFileError(f"{where}: head_dim {d['head_dim']} must equal hidden_size / num_attention_heads = {dim / heads:g}")
    threshold = d.get("early_exit_threshold")
    try:
        return LoopedConfig(
            dim=dim,
            n_heads=heads,
            n_kv_heads=int(d.get("num_key_value_heads") or heads),
            ffn_dim=int(d["intermediate_size"]),
            vocab_size=int(d["vocab_size"]),
            default_loops=int(d["total_ut_steps"]),
            max_seq_len=int(d.get("max_position_embeddings", 2048)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tied_output=bool(d.get("tie_word_embeddings", False)),
            n_layers=int(d["num_hidden_layers"]),
            norm_layout="sandwich",
            step_norm=True,
            exit_gate=True,
            exit_threshold=float(threshold) if threshold is not None and 0 < float(threshold) <= 1 else None,
        )
    except ValueError as e:
        raise ModelFileError(f"{where}: {e}") from None


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
    with open(os.path.join(directory, "config.json")) as f:
        config = ouro_config(json.load(f), os.path.join(directory, "config.json"))
    tensors = _read_tensors(directory)
    if "lm_head.weight" in tensors and config.tied_output:
        config.tied_output = False  # a head stored beside tie_word_embeddings: serve the stored one
    model = LoopedLlama(config)
    fill_parameters(ouro_names(model), tensors, directory)
    extra = sorted(set(tensors) - {n for n, _ in ouro_names(model)})
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
