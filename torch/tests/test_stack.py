"""Stacked models (format version 2): files, the Hugging Face Ouro layout, and
early exit computed two ways (whole sequence at once, and token by token with
a cache) agreeing. Run: /usr/bin/python3 -m unittest discover -s tests"""

import itertools
import json
import os
import tempfile
import unittest

import torch

from loopserve_torch.crosscheck import random_model
from loopserve_torch.hf import load_ouro, write_ouro
from loopserve_torch.model import Decoder, LoopedConfig, generate
from loopserve_torch.safetensors_io import ModelFileError, load, read_safetensors, save
from test_safetensors_io import rewrite_metadata

torch.set_num_threads(1)

OURO = dict(dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=120, default_loops=4, max_seq_len=64,
            n_layers=3, norm_layout="sandwich", step_norm=True, exit_gate=True)


def ouro_model(seed: int = 5, **changes):
    return random_model(LoopedConfig(**{**OURO, **changes}), seed)


def tokens(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, 120, (1, n), generator=torch.Generator().manual_seed(seed))


class Files(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "m.safetensors")

    def tearDown(self) -> None:
        self.dir.cleanup()

    def test_stack_round_trip(self) -> None:
        m = ouro_model(exit_threshold=0.75)
        save(m, self.path)
        meta, tensors = read_safetensors(self.path)
        self.assertEqual(meta["format_version"], "2")
        self.assertEqual((meta["n_layers"], meta["norm_layout"], meta["step_norm"], meta["exit_threshold"]), ("3", "sandwich", "1", "0.75"))
        self.assertIn("layers.2.ffn_out_norm.weight", tensors)
        self.assertNotIn("block.wq.weight", tensors)
        self.assertEqual(list(tensors["exit_gate.weight"].shape), [1, 32])
        self.assertEqual(list(tensors["exit_gate.bias"].shape), [1])
        back = load(self.path)
        self.assertEqual(back.config, m.config)
        for (n, p), (_, q) in zip(m.named_parameters(), back.named_parameters()):
            self.assertTrue(torch.equal(p.detach().half().float(), q.detach()), n)

    def test_single_block_with_stack_options_keeps_block_prefix(self) -> None:
        save(ouro_model(n_layers=1), self.path)
        meta, tensors = read_safetensors(self.path)
        self.assertEqual((meta["format_version"], meta["n_layers"]), ("2", "1"))
        self.assertIn("block.attn_out_norm.weight", tensors)

    def test_plain_single_block_stays_version_1(self) -> None:
        save(random_model(LoopedConfig(dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=120), 1), self.path)
        meta, _ = read_safetensors(self.path)
        self.assertEqual(meta["format_version"], "1")
        self.assertFalse({"n_layers", "norm_layout", "step_norm", "exit_threshold"} & set(meta))

    def test_refusals(self) -> None:
        cases = [
            ({"format_version": "1"}, "format_version '1' may not use n_layers"),
            ({"norm_layout": "post"}, "norm_layout must be one of pre, sandwich"),
            ({"step_norm": "yes"}, "step_norm must be '0' or '1'"),
            ({"n_layers": "1"}, "missing tensor 'block.attn_norm.weight'"),
            ({"n_layers": "0"}, "n_layers must be in"),
            ({"exit_threshold": "1.5"}, "exit_threshold must be in"),
        ]
        for change, message in cases:
            save(ouro_model(), self.path)
            rewrite_metadata(self.path, **change)
            with self.assertRaisesRegex(ModelFileError, message, msg=str(change)):
                load(self.path)
        with self.assertRaisesRegex(ValueError, "exit_threshold needs the exit gate"):
            LoopedConfig(**{**OURO, "exit_gate": False, "exit_threshold": 0.5})


class EarlyExit(unittest.TestCase):
    def test_fixed_depth_three_ways(self) -> None:
        """No exit: the full forward, exit_forward and the cached decoder agree."""
        m, x = ouro_model(), tokens(14)
        with torch.no_grad():
            for loops in (1, 2, 4, 6):
                full = m(x, loops)
                self.assertTrue(torch.equal(full, m.exit_forward(x, loops, None)[0]))
                d = Decoder(m, loops, None, kv_fp16=False)
                rows = [d.prefill(x[0, :6].tolist())[0]] + [d.step(t)[0][None] for t in x[0, 6:].tolist()]
                torch.testing.assert_close(torch.cat(rows), full[0], rtol=0, atol=1e-4)

    def test_exit_whole_sequence_equals_token_by_token(self) -> None:
        """exit_forward (every position after the prompt exits as a sampled token) and the
        decoder (one token at a time) agree under either policy: exact (every step runs, the
        exit step selected) and copy (deeper slots of an exited token filled with copies)."""
        m, x = ouro_model(), tokens(16)
        exits = torch.zeros(1, 16, dtype=torch.bool)
        exits[0, 5:] = True  # positions 0..4 are a prompt; its last (4) is sampled, so it exits too
        exits[0, 4] = True
        seen = set()
        with torch.no_grad():
            for (loops, thr), policy in itertools.product(((4, 0.5), (4, 0.9), (8, 0.7), (3, 1.0)), ("exact", "copy")):
                lg, steps = m.exit_forward(x, loops, thr, exits, policy=policy)
                d = Decoder(m, loops, thr, kv_fp16=False, policy=policy)
                first, s0 = d.prefill(x[0, :5].tolist())
                rows, got = [first], [s0]
                for t in x[0, 5:].tolist():
                    row, s = d.step(t)
                    rows.append(row[None])
                    got.append(s)
                self.assertEqual(got, steps[0, 4:].tolist(), (loops, thr, policy))
                self.assertTrue((steps[0, :4] == loops - 1).all())
                torch.testing.assert_close(torch.cat(rows), lg[0], rtol=0, atol=1e-4)
                seen |= set(got)
        self.assertGreater(len(seen), 2, "the fixture should exit at several steps")

    def test_exited_token_deeper_slots_hold_copies(self) -> None:
        m = ouro_model()
        with torch.no_grad():
            for t in range(30):
                d = Decoder(m, 4, 0.5, policy="copy")
                d.prefill([t, t + 1, t + 2])
                _, s = d.step(t + 3)
                if s < 3:
                    break
            self.assertLess(s, 3)
            L = m.config.n_layers
            for i in range(L):
                for s2 in range(s + 1, 4):
                    self.assertTrue(torch.equal(d.k[s2 * L + i][:, :, -1], d.k[s * L + i][:, :, -1]))
                    self.assertTrue(torch.equal(d.v[s2 * L + i][:, :, -1], d.v[s * L + i][:, :, -1]))
            self.assertTrue(all(k.shape[2] == 4 for k in d.k))

    def test_exact_exit_is_every_step_select(self) -> None:
        """The exact policy's logits are each position's at its exit step of a full-depth run
        (the published code's every step, select), and its cache equals a full-depth run's."""
        m, x = ouro_model(), tokens(12)
        with torch.no_grad():
            states = m.step_states(x, 4)
            lg, steps = m.exit_forward(x, 4, 0.5, policy="exact")
            for t in range(12):
                want = m.head_input(states[int(steps[0, t])][0, t]) @ m.head_weight().t()
                torch.testing.assert_close(lg[0, t], want, rtol=0, atol=1e-5)
            d, full = Decoder(m, 4, 0.5, policy="exact"), Decoder(m, 4, None)
            d.prefill(x[0, :6].tolist())
            full.prefill(x[0, :6].tolist())
            for t in x[0, 6:].tolist():
                d.step(t)
                full.step(t)
            for a, b in zip(d.k + d.v, full.k + full.v):
                self.assertTrue(torch.equal(a, b))

    def test_threshold_one_is_fixed_depth(self) -> None:
        m = ouro_model()
        r = generate(m, [1, 2, 3], 6, 4, 1.0)
        plain = generate(m, [1, 2, 3], 6, 4, None)
        self.assertEqual(r["tokens"], plain["tokens"])
        self.assertEqual(r["exit_steps"], [3] * 6)


class HuggingFace(unittest.TestCase):
    def test_ouro_checkpoint_loads_with_the_documented_mapping(self) -> None:
        m = ouro_model(tied_output=False)
        with tempfile.TemporaryDirectory() as d:
            for dtype, shards in (("BF16", 2), ("F32", 1)):
                write_ouro(m, d, dtype, shards)
                back = load_ouro(d)
                self.assertEqual(back.config, m.config)
                for (n, p), (_, q) in zip(m.named_parameters(), back.named_parameters()):
                    want = p.detach().to(torch.bfloat16).float() if dtype == "BF16" else p.detach()
                    self.assertTrue(torch.equal(want, q.detach()), (dtype, n))
                for f in os.listdir(d):
                    os.unlink(os.path.join(d, f))

    def test_ouro_refusals(self) -> None:
        m = ouro_model()
        with tempfile.TemporaryDirectory() as d:
            write_ouro(m, d, "BF16", 2)
            os.unlink(os.path.join(d, "model-00002-of-00002.safetensors"))
            with self.assertRaisesRegex(ModelFileError, "shard 'model-00002-of-00002.safetensors' is missing"):
                load_ouro(d)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            cfg["model_type"], cfg["architectures"] = "llama", ["LlamaForCausalLM"]
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            with self.assertRaisesRegex(ModelFileError, "unknown architecture"):
                load_ouro(d)


class Training(unittest.TestCase):
    def test_stage1_loss_parts(self) -> None:
        import numpy as np

        from loopserve_torch.train import OutOfTextHead, exit_distribution, gate_lambdas, stage1_loss

        m = ouro_model(vocab_size=200)
        seen = np.sort(np.random.default_rng(1).choice(200, 80, replace=False))
        head = OutOfTextHead(m, seen)
        x = torch.from_numpy(np.random.default_rng(2).choice(seen, (2, 12)))
        y = torch.from_numpy(np.random.default_rng(3).choice(seen, (2, 12)))
        nll, states = head.step_nll(m, x, y, 4)
        exported = head.export_embedding(m)
        with torch.no_grad():
            for t in range(4):  # the restricted softmax at each step is the exported model's full one
                full = torch.nn.functional.cross_entropy(exported(x, t + 1).reshape(-1, 200), y.reshape(-1), reduction="none")
                torch.testing.assert_close(nll[t], full, rtol=1e-4, atol=1e-4)
        p = exit_distribution(gate_lambdas(m, states))
        torch.testing.assert_close(p.sum(0), torch.ones(24))
        loss, _ = stage1_loss(m, head, x, y, 4, 0.0)
        torch.testing.assert_close(loss, (p * nll).sum(0).mean())


if __name__ == "__main__":
    unittest.main()
