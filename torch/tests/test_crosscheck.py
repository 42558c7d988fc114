"""`crosscheck logits`, the reference the kernels are compared with: float64,
K and V rounded to fp16 through the decoder's cache, and its rounding noise.
Run: /usr/bin/python3 -m unittest discover -s tests"""

import unittest

import torch

from loopserve_torch.crosscheck import random_model, reference
from loopserve_torch.model import LoopedConfig, generate

torch.set_num_threads(1)

CONFIG = dict(dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=120, default_loops=4, max_seq_len=64,
              n_layers=2, norm_layout="sandwich", step_norm=True, exit_gate=True)
PROMPT = [5, 17, 3, 99, 42, 8, 61, 0]


def model64() -> torch.nn.Module:
    return random_model(LoopedConfig(**CONFIG), 3).double()


class Reference(unittest.TestCase):
    def test_decoder_in_float64_is_the_full_forward(self) -> None:
        m = model64()
        with torch.no_grad():
            r = generate(m, PROMPT, 4, 3)
            full = m(torch.tensor([PROMPT + r["tokens"][:-1]]), 3, kv_fp16=True)[0]
        self.assertEqual(r["prompt_logits"].dtype, torch.float64)
        torch.testing.assert_close(torch.cat((r["prompt_logits"], r["logits"][1:])), full, rtol=0, atol=1e-9)

    def test_a_hook_that_rounds_is_the_cache_rounding(self) -> None:
        """The noise runs round K and V in the hook instead: with no nudge they are the reference, forced tokens and all."""
        m = model64()
        r = generate(m, PROMPT, 5, 4, 0.5)
        same = generate(m, PROMPT, 5, 4, 0.5, kv_fp16=False, forced=r["tokens"],
                        kv_hook=lambda k, v: (k.half().to(k.dtype), v.half().to(v.dtype)))
        self.assertTrue(torch.equal(same["prompt_logits"], r["prompt_logits"]))
        self.assertTrue(torch.equal(same["logits"], r["logits"]))
        self.assertEqual(same["exit_steps"], r["exit_steps"])

    def test_rounding_noise_is_what_float32_sized_nudges_do(self) -> None:
        m = model64()
        out = reference(m, PROMPT, 4, 6, None)
        spread = torch.tensor(out["logits"]).std().item()
        self.assertGreater(out["rounding_noise"], 0)  # some roundings flip
        self.assertLess(out["rounding_noise"], 1e-2 * spread)  # and move the logits a little
        top2 = torch.tensor(out["greedy_logits"], dtype=torch.float64).topk(2).values
        self.assertEqual(out["greedy_margins"], (top2[:, 0] - top2[:, 1]).tolist())
        self.assertNotIn("exit_steps", out)
        self.assertIn("exit_steps", reference(m, PROMPT, 4, 6, 0.5))


if __name__ == "__main__":
    unittest.main()
