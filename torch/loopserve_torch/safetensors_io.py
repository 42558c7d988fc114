"""loopserve model files (.safetensors) from and to PyTorch, without the
safetensors package: an 8-byte little-endian header length, a JSON header
(tensor name -> dtype, shape, data_offsets; "__metadata__" -> strings), then
the raw little-endian tensor data. Each tensor starts 8-byte aligned, as
loopserve's own writer places them (the kernels map the file and read fp16
in place).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import tempfile

import numpy as np
import torch

from .model import LoopedConfig, LoopedLlama

FORMAT_NAME = "loopserve"
FORMAT_VERSION = "1"  # what a single-block file is written as
FORMAT_VERSION_STACK = "2"  # a file using any of the stack keys (n_layers, norm_layout, ...)
FORMAT_VERSIONS = ("1", "2")
ARCH = "looped-llama"
TOKENIZER = "gpt2"
TOKENIZERS = ("gpt2", "bpe")  # this package works on token ids: either loads
STACK_KEYS = ("n_layers", "norm_layout", "step_norm", "exit_threshold")
# recurrent depth (docs/model-format.md): metadata key -> (LoopedConfig field, parser)
RECURRENT_KEYS = {
    "head_dim": ("attn_head_dim", "int"),
    "n_prelude": ("n_prelude", "int"),
    "n_coda": ("n_coda", "int"),
    "injection": ("injection", "str"),
    "embed_scale": ("embed_scale", "float"),
    "state_std": ("state_std", "float"),
    "mid_norm": ("mid_norm", "flag"),
    "rope_layout": ("rope_layout", "str"),
    "qk_bias": ("qk_bias", "flag"),
}

# safetensors dtype name -> numpy dtype (bf16 read as raw uint16 then widened;
# U8/I8 hold quantized codes, which `load` refuses by the metadata)
_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16, "U8": np.uint8, "I8": np.int8}

BLOCK_TENSORS = ["attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"]


class ModelFileError(ValueError):
    """A file that is not a loopserve fp16 model; the message names the field or tensor."""


def config_metadata(c: LoopedConfig) -> dict[str, str]:
    """The metadata loopserve requires, every value a string: format version 1
    exactly as before for a single-block model, version 2 with the stack keys
    when the config uses any of them (docs/model-format.md)."""
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION_STACK if c.stacked else FORMAT_VERSION,
        "arch": ARCH,
        "dim": str(c.dim),
        "n_heads": str(c.n_heads),
        "n_kv_heads": str(c.n_kv_heads),
        "ffn_dim": str(c.ffn_dim),
        "vocab_size": str(c.vocab_size),
        "default_loops": str(c.default_loops),
        "max_seq_len": str(c.max_seq_len),
        "rope_theta": repr(float(c.rope_theta)),
        "norm_eps": repr(float(c.norm_eps)),
        "quant": "fp16",
        "group_size": "0",
        "tokenizer": TOKENIZER,
    }
    if c.stacked:
        meta["n_layers"] = str(c.n_layers)
        meta["norm_layout"] = c.norm_layout
        meta["step_norm"] = "1" if c.step_norm else "0"
        if c.exit_threshold is not None:
            meta["exit_threshold"] = repr(float(c.exit_threshold))
        defaults = LoopedConfig(dim=c.dim, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads)
        for key, (field, kind) in RECURRENT_KEYS.items():
            value = getattr(c, field)
            if value != getattr(defaults, field) and not (key == "head_dim" and value * c.n_heads == c.dim):
                meta[key] = ("1" if value else "0") if kind == "flag" else repr(float(value)) if kind == "float" else str(value)
    return meta


def model_tensors(model: LoopedLlama) -> list[tuple[str, torch.Tensor]]:
    """(file name, tensor) in the order loopserve's writer uses: layers under
    `block.` (one layer) or `layers.<i>.`, the exit gate last."""
    out = [("tok_embeddings.weight", model.tok_embeddings.weight)]
    for prefix, b in model.named_layers():
        out += b.named_tensors(prefix)
    if model.config.injection == "adapter":
        out.append(("adapter.weight", model.adapter.weight))
    out.append(("norm.weight", model.norm.weight))
    if model.output is not None:
        out.append(("output.weight", model.output.weight))
    if model.config.exit_gate:
        out += [("exit_gate.weight", model.exit_gate.weight), ("exit_gate.bias", model.exit_gate.bias)]
    return out


def _to_fp16(name: str, t: torch.Tensor) -> np.ndarray:
    """fp32/bf16/fp16 -> fp16 bytes; refuses what fp16 cannot hold."""
    x = t.detach().to(torch.float32).cpu()
    if not torch.isfinite(x).all():
        raise ModelFileError(f"tensor {name!r} has non-finite values")
    if x.abs().max().item() > 65504.0:
        raise ModelFileError(f"tensor {name!r} has values beyond fp16's range (|x| > 65504)")
    return x.numpy().astype("<f2")


def save(model: LoopedLlama, path: str, metadata: dict[str, str] | None = None) -> int:
    """Writes `model` as a loopserve fp16 model file; returns its size in bytes.

    `metadata` adds keys (e.g. "description", "training_tokens"); it cannot
    change the keys that describe the architecture. The file is written to a
    temporary beside `path` and renamed into place, so a server that has the
    old file mapped keeps a valid mapping.
    """
    meta = config_metadata(model.config)
    for k, v in (metadata or {}).items():
        if k in meta and meta[k] != str(v):
            raise ModelFileError(f"metadata key {k!r} is set from the model config ({meta[k]!r}), got {v!r}")
        meta[k] = str(v)
    header: dict[str, object] = {"__metadata__": meta}
    blobs: list[tuple[int, bytes]] = []
    offset = 0
    for name, t in model_tensors(model):
        data = _to_fp16(name, t).tobytes()
        begin = (offset + 7) // 8 * 8
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [begin, begin + len(data)]}
        blobs.append((begin, data))
        offset = begin + len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((-len(head)) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".tmp-")
    umask = os.umask(0)
    os.umask(umask)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask)  # mkstemp's 0600 would hide the model from a service user
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            pos = 0
            for begin, data in blobs:
                f.write(b"\0" * (begin - pos))
                f.write(data)
                pos = begin + len(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(path)


def read_safetensors(path: str) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, name -> array) of a safetensors file with F16, BF16, F32, U8 or I8 tensors."""
    with open(path, "rb") as f:  # mapped, not read: a Hugging Face shard is gigabytes
        raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
    if len(raw) < 8:
        raise ModelFileError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ModelFileError(f"{path}: header length {n} runs past the end of the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError as e:
        raise ModelFileError(f"{path}: header is not JSON: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n :]
    tensors: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        dtype = spec.get("dtype")
        if dtype not in _NP_DTYPES:
            raise ModelFileError(f"{path}: tensor {name!r}: dtype {dtype} (this reader takes F16, BF16, F32, U8, I8)")
        begin, end = spec["data_offsets"]
        shape = [int(d) for d in spec["shape"]]
        count = int(np.prod(shape)) if shape else 1
        size = np.dtype(_NP_DTYPES[dtype]).itemsize
        if end - begin != count * size or end > len(data):
            raise ModelFileError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] do not fit {dtype} {shape}")
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(_NP_DTYPES[dtype]).newbyteorder("<")).reshape(shape)
        if dtype == "BF16":  # bf16 is the top half of an fp32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = arr
    return meta, tensors


def _need(meta: dict[str, str], key: str, path: str) -> str:
    if key not in meta:
        raise ModelFileError(f"{path}: metadata: missing required key {key!r}")
    return meta[key]


def _int(meta: dict[str, str], key: str, path: str) -> int:
    s = _need(meta, key, path)
    if not re.fullmatch(r"0|[1-9][0-9]*", s):
        raise ModelFileError(f"{path}: metadata: {key} must be a decimal integer, got {s!r}")
    return int(s)


def _float(meta: dict[str, str], key: str, path: str) -> float:
    s = _need(meta, key, path)
    if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", s):
        raise ModelFileError(f"{path}: metadata: {key} must be a decimal number, got {s!r}")
    return float(s)


def _stack_fields(meta: dict[str, str], path: str, gate: bool) -> dict:
    """The stack keys of format version 2 (absent: the single-block defaults)."""
    used = [k for k in (*STACK_KEYS, *RECURRENT_KEYS) if k in meta]
    if meta.get("format_version") == "1" and (used or gate):
        what = used[0] if used else "tensor 'exit_gate.weight'"
        raise ModelFileError(f"{path}: metadata: format_version '1' may not use {what} (format_version '2' introduces it)")
    out: dict = {"exit_gate": gate}
    if "n_layers" in meta:
        out["n_layers"] = _int(meta, "n_layers", path)
    if "norm_layout" in meta:
        out["norm_layout"] = meta["norm_layout"]
    if "step_norm" in meta:
        if meta["step_norm"] not in ("0", "1"):
            raise ModelFileError(f"{path}: metadata: step_norm must be '0' or '1', got {meta['step_norm']!r}")
        out["step_norm"] = meta["step_norm"] == "1"
    if "exit_threshold" in meta:
        out["exit_threshold"] = _float(meta, "exit_threshold", path)
    for key, (field, kind) in RECURRENT_KEYS.items():
        if key not in meta:
            continue
        if kind == "flag":
            if meta[key] not in ("0", "1"):
                raise ModelFileError(f"{path}: metadata: {key} must be '0' or '1', got {meta[key]!r}")
            out[field] = meta[key] == "1"
        else:
            out[field] = _int(meta, key, path) if kind == "int" else _float(meta, key, path) if kind == "float" else meta[key]
    return out


def _config(meta: dict[str, str], path: str, tied: bool, gate: bool = False) -> LoopedConfig:
    """The config of a file's metadata; every key required, as loopserve requires it."""
    stack = _stack_fields(meta, path, gate)
    try:
        return LoopedConfig(
            dim=_int(meta, "dim", path),
            n_heads=_int(meta, "n_heads", path),
            n_kv_heads=_int(meta, "n_kv_heads", path),
            ffn_dim=_int(meta, "ffn_dim", path),
            vocab_size=_int(meta, "vocab_size", path),
            default_loops=_int(meta, "default_loops", path),
            max_seq_len=_int(meta, "max_seq_len", path),
            rope_theta=_float(meta, "rope_theta", path),
            norm_eps=_float(meta, "norm_eps", path),
            tied_output=tied,
            **stack,
        )
    except ModelFileError:
        raise
    except ValueError as e:  # LoopedConfig's consistency checks
        raise ModelFileError(f"{path}: metadata: {e}") from None


def load(path: str) -> LoopedLlama:
    """Reads a loopserve fp16 model file into a float32 LoopedLlama (eval mode)."""
    meta, tensors = read_safetensors(path)
    for key, want in (("format", FORMAT_NAME), ("arch", ARCH)):
        if meta.get(key) != want:
            raise ModelFileError(f"{path}: metadata: {key} must be {want!r}, got {meta.get(key)!r}")
    for key, allowed in (("format_version", FORMAT_VERSIONS), ("tokenizer", TOKENIZERS)):
        if meta.get(key, "gpt2" if key == "tokenizer" else None) not in allowed:
            want = " or ".join(repr(a) for a in allowed)
            raise ModelFileError(f"{path}: metadata: {key} must be {want}, got {meta.get(key)!r}")
    if _need(meta, "quant", path) != "fp16":
        raise ModelFileError(f"{path}: metadata: quant {meta['quant']!r}: this loader reads fp16 models")
    # An fp16 block may carry a quantized head (and no output.weight): not a tied model.
    if meta.get("output_quant", "fp16") != "fp16" or "output.qweight" in tensors:
        raise ModelFileError(f"{path}: the output head is quantized: this loader reads fp16 models")
    gate = "exit_gate.weight" in tensors or "exit_gate.bias" in tensors
    model = LoopedLlama(_config(meta, path, tied="output.weight" not in tensors, gate=gate))
    fill_parameters(model_tensors(model), tensors, path)
    # Tensors beyond the config's are ignored, as loopserve ignores them (docs/model-format.md).
    return model.eval()


def fill_parameters(named: list[tuple[str, torch.Tensor]], tensors: dict[str, np.ndarray], where: str) -> None:
    """Copies each named parameter from `tensors` (arrays by file name), which must hold it in its shape as F16 or F32 values."""
    with torch.no_grad():
        for name, param in named:
            if name not in tensors:
                raise ModelFileError(f"{where}: missing tensor {name!r}")
            arr = tensors[name]
            if list(arr.shape) != list(param.shape):
                raise ModelFileError(f"{where}: tensor {name!r}: shape must be {list(param.shape)}, got {list(arr.shape)}")
            if arr.dtype not in (np.float16, np.float32):
                raise ModelFileError(f"{where}: tensor {name!r}: dtype {arr.dtype} (BF16, F16 or F32 only)")
            param.copy_(torch.from_numpy(arr.astype(np.float32)))
