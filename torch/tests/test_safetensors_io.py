"""save/load refusals: what loopserve would refuse, PyTorch refuses first,
naming the field or tensor. Run: /usr/bin/python3 -m unittest discover -s tests"""

import json
import math
import os
import struct
import tempfile
import unittest

import torch

from loopserve_torch.model import LoopedConfig, LoopedLlama
from loopserve_torch.safetensors_io import ModelFileError, load, read_safetensors, save

SMALL = dict(dim=16, n_heads=2, n_kv_heads=1, ffn_dim=32, vocab_size=50, default_loops=2, max_seq_len=64)


def small_model() -> LoopedLlama:
    m = LoopedLlama(LoopedConfig(**SMALL))
    m.init_weights(1)
    return m


def rewrite_metadata(path: str, **changes: str | None) -> None:
    """Rewrites a file's header with metadata keys changed (None removes one)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for k, v in changes.items():
        if v is None:
            header["__metadata__"].pop(k)
        else:
            header["__metadata__"][k] = v
    head = json.dumps(header).encode()
    head += b" " * ((-len(head)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw[8 + n :])


class SaveLoad(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.safetensors")

    def tearDown(self) -> None:
        self.dir.cleanup()

    def test_round_trip_and_metadata(self) -> None:
        m = small_model()
        save(m, self.path, {"description": "x", "max_seq_len": 64})  # agreeing keys are fine
        meta, tensors = read_safetensors(self.path)
        self.assertEqual(meta["description"], "x")
        self.assertEqual(meta["quant"], "fp16")
        self.assertEqual(oct(os.stat(self.path).st_mode & 0o777), oct(0o666 & ~_umask()))
        back = load(self.path)
        self.assertTrue(torch.equal(back.block.w2.weight, m.block.w2.weight.half().float()))
        self.assertNotIn("output.weight", tensors)

    def test_save_refusals(self) -> None:
        m = small_model()
        with self.assertRaisesRegex(ModelFileError, "metadata key 'dim' is set from the model config"):
            save(m, self.path, {"dim": "17"})
        with torch.no_grad():
            m.block.wq.weight[0, 0] = math.nan
        with self.assertRaisesRegex(ModelFileError, "'block.wq.weight' has non-finite values"):
            save(m, self.path)
        with torch.no_grad():
            m.block.wq.weight[0, 0] = 70000.0
        with self.assertRaisesRegex(ModelFileError, "'block.wq.weight' has values beyond fp16's range"):
            save(m, self.path)
        self.assertEqual(os.listdir(self.dir.name), [])  # nothing half-written left behind

    def test_load_refusals(self) -> None:
        cases = [
            ({"format_version": "3"}, "format_version must be '1' or '2'"),
            ({"rope_theta": None}, "missing required key 'rope_theta'"),
            ({"dim": "+16"}, "dim must be a decimal integer"),
            ({"norm_eps": "1e-5x"}, "norm_eps must be a decimal number"),
            ({"n_kv_heads": "3"}, "must be a multiple of n_kv_heads"),
            ({"vocab_size": str(1 << 21)}, r"vocab_size must be in \[1, 1048576\]"),
            ({"quant": "int4"}, "quant 'int4': this loader reads fp16 models"),
            ({"output_quant": "int8"}, "the output head is quantized: this loader reads fp16 models"),
        ]
        for change, message in cases:
            save(small_model(), self.path)
            rewrite_metadata(self.path, **change)
            with self.assertRaisesRegex(ModelFileError, message, msg=str(change)):
                load(self.path)

    def test_config_limits(self) -> None:
        with self.assertRaisesRegex(ValueError, "rope_theta must be in"):
            LoopedConfig(**{**SMALL, "rope_theta": 1e13})
        with self.assertRaisesRegex(ValueError, "head_dim = 3 must be even"):
            LoopedConfig(**{**SMALL, "dim": 6, "n_heads": 2})


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


if __name__ == "__main__":
    unittest.main()


class RecurrentDepth(unittest.TestCase):
    """A recurrent-depth model (docs/model-format.md) saves with its keys and tensors and loads back computing the same."""

    def test_round_trip(self) -> None:
        c = LoopedConfig(**{**SMALL, "n_kv_heads": 2}, n_layers=2, norm_layout="sandwich_sum", n_prelude=1, n_coda=1, injection="adapter",
                         embed_scale=4.0, state_std=0.5, mid_norm=True, rope_layout="interleaved", qk_bias=True, attn_head_dim=12)
        m = LoopedLlama(c)
        m.init_weights(3)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.safetensors")
            save(m, path)
            meta, tensors = read_safetensors(path)
            self.assertEqual({k: meta[k] for k in ("format_version", "n_prelude", "n_coda", "injection", "mid_norm", "rope_layout", "qk_bias", "head_dim")},
                             {"format_version": "2", "n_prelude": "1", "n_coda": "1", "injection": "adapter", "mid_norm": "1", "rope_layout": "interleaved",
                              "qk_bias": "1", "head_dim": "12"})
            self.assertEqual(list(tensors["adapter.weight"].shape), [16, 32])
            self.assertEqual(list(tensors["coda.0.wq.bias"].shape), [24])
            self.assertIn("prelude.0.ffn_out_norm.weight", tensors)
            back = load(path)
        tokens = torch.tensor([[3, 7, 11, 2]])
        with torch.no_grad():
            want = m.half().float()(tokens, 3)  # the file holds fp16 weights
            got = back(tokens, 3)
        self.assertLess((want - got).abs().max().item(), 1e-5)
        # the decoder, a token at a time with its caches, computes what the whole sequence does
        from loopserve_torch.model import Decoder
        d = Decoder(back, 3, kv_fp16=False)
        rows = torch.cat([d.prefill([3, 7])[0], d.step(11)[0][None], d.step(2)[0][None]])
        self.assertLess((rows - got[0]).abs().max().item(), 1e-4)
