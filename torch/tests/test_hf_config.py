"""The PyTorch reference reads Hugging Face Ouro configs as the importer does: every
case of hf_config_cases.json (the table test/model/hf_config_table.test.ts holds the
importer to) resolves to its `expect`, or is refused naming its file and key.
Run: /usr/bin/python3 -m unittest discover -s tests -p test_hf_config.py"""

import json
import os
import tempfile
import unittest

import torch

from loopserve_torch.crosscheck import random_model
from loopserve_torch.hf import load_ouro, ouro_end_ids, write_ouro
from loopserve_torch.model import LoopedConfig
from loopserve_torch.safetensors_io import ModelFileError

torch.set_num_threads(1)

TABLE = json.load(open(os.path.join(os.path.dirname(__file__), "hf_config_cases.json")))
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def laid_over(base: dict | None, over: dict | None) -> dict | None:
    """`over` laid over `base`; a null in `over` removes the key."""
    out = dict(base or {})
    for k, v in (over or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def write_case(directory: str, case: dict) -> None:
    s = {**TABLE["shape"], **case.get("shape", {})}
    c = LoopedConfig(dim=s["dim"], n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"], ffn_dim=s["ffn_dim"], vocab_size=s["vocab_size"],
                     default_loops=4, max_seq_len=64, tied_output=s["tied"], n_layers=s["n_layers"], norm_layout="sandwich",
                     step_norm=True, exit_gate=True)
    write_ouro(random_model(c, 1), directory)
    shape_keys = {"hidden_size": s["dim"], "num_attention_heads": s["n_heads"], "num_key_value_heads": s["n_kv_heads"],
                  "intermediate_size": s["ffn_dim"], "vocab_size": s["vocab_size"], "num_hidden_layers": s["n_layers"]}
    files = {
        "config.json": laid_over({**TABLE["config"], **shape_keys}, case.get("config")),
        "generation_config.json": None if "generation_config" in case and case["generation_config"] is None
        else laid_over(TABLE["generation_config"], case.get("generation_config")),
        "tokenizer_config.json": laid_over(TABLE["tokenizer_config"], case.get("tokenizer_config")),
        "tokenizer.json": {"added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(TOKENS)],
                           "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(TOKENS)}, "merges": []}},
    }
    for name, value in files.items():
        if value is not None:
            with open(os.path.join(directory, name), "w") as f:
                json.dump(value, f)


def resolved(directory: str) -> dict:
    c = load_ouro(directory).config
    return {"default_loops": c.default_loops, "exit_threshold": c.exit_threshold, "max_seq_len": c.max_seq_len, "n_kv_heads": c.n_kv_heads,
            "rope_theta": c.rope_theta, "norm_eps": c.norm_eps, "tied_output": c.tied_output, "eos_ids": ouro_end_ids(directory, c.vocab_size)}


class ConfigTable(unittest.TestCase):
    def test_every_case(self) -> None:
        for case in TABLE["cases"]:
            with self.subTest(case["name"]), tempfile.TemporaryDirectory() as d:
                write_case(d, case)
                if "refuse" in case:
                    with self.assertRaises(ModelFileError) as refused:
                        resolved(d)
                    message = str(refused.exception)
                    self.assertIn(os.path.join(d, case["refuse"]["file"]), message)
                    self.assertIn(case["refuse"]["key"], message)
                else:
                    got = resolved(d)
                    self.assertEqual({k: got[k] for k in case["expect"]}, case["expect"])


if __name__ == "__main__":
    unittest.main()
