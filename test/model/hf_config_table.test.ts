// One reader of Hugging Face configs: the importer (src/model/hf_checkpoint.ts)
// and the PyTorch reference (torch/loopserve_torch/hf.py) resolve every case
// of torch/tests/hf_config_cases.json to the same defaults, or refuse it
// naming the same file and key. The importer is checked here; the reference
// by its own test over the same table (torch/tests/test_hf_config.py), run
// here with Debian's interpreter.
import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { readHfCheckpoint } from "../../src/model/hf_checkpoint.ts";
import { writeHfFixture } from "../helpers/hf_fixture.ts";
import { testTempDir } from "../helpers/models.ts";
import { modelFormatMessage } from "../helpers/safetensors.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import { runPythonModule } from "../helpers/torch.ts";

setDefaultTimeout(60_000); // importing torch takes seconds on a busy machine

type Json = Record<string, unknown>;
interface Shape {
  dim: number;
  n_heads: number;
  n_kv_heads: number;
  ffn_dim: number;
  vocab_size: number;
  n_layers: number;
  tied: boolean;
}
interface Case {
  name: string;
  shape?: Partial<Shape>;
  config?: Json;
  generation_config?: Json | null;
  tokenizer_config?: Json;
  expect?: Json;
  refuse?: { file: string; key: string };
}
const TABLE: { shape: Shape; config: Json; generation_config: Json; tokenizer_config: Json; cases: Case[] } = JSON.parse(
  readFileSync(resolve(import.meta.dir, "../../torch/tests/hf_config_cases.json"), "utf8"),
);

/** `over` laid over `base`; a null in `over` removes the key. */
function laidOver(base: Json, over: Json = {}): Json {
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}

let n = 0;
function writeCase(c: Case): string {
  const dir = join(testTempDir(), `hf-config-${n++}`);
  const s = { ...TABLE.shape, ...c.shape };
  writeHfFixture(dir, { dim: s.dim, nHeads: s.n_heads, nKvHeads: s.n_kv_heads, ffnDim: s.ffn_dim, vocabSize: s.vocab_size, nLayers: s.n_layers, tied: s.tied, totalUtSteps: 4, seed: 1 });
  const shapeKeys = {
    hidden_size: s.dim,
    num_attention_heads: s.n_heads,
    num_key_value_heads: s.n_kv_heads,
    intermediate_size: s.ffn_dim,
    vocab_size: s.vocab_size,
    num_hidden_layers: s.n_layers,
  };
  const json = (name: string, v: Json) => writeFileSync(join(dir, name), JSON.stringify(v));
  json("config.json", laidOver({ ...TABLE.config, ...shapeKeys }, c.config));
  if (c.generation_config === null) rmSync(join(dir, "generation_config.json"));
  else json("generation_config.json", laidOver(TABLE.generation_config, c.generation_config));
  json("tokenizer_config.json", laidOver(TABLE.tokenizer_config, c.tokenizer_config));
  return dir;
}

function resolved(dir: string): Json {
  const ck = readHfCheckpoint(dir);
  const m = ck.model;
  return {
    default_loops: m.defaultLoops,
    exit_threshold: m.exitThreshold,
    max_seq_len: m.maxSeqLen,
    n_kv_heads: m.nKvHeads,
    rope_theta: m.ropeTheta,
    norm_eps: m.normEps,
    tied_output: m.tiedOutput,
    eos_ids: ck.eosIds,
  };
}

describe("the importer reads every case of the config table", () => {
  for (const c of TABLE.cases)
    test(c.name, () => {
      const dir = writeCase(c);
      if (c.refuse) {
        const message = modelFormatMessage(() => resolved(dir));
        expect(message).toContain(join(dir, c.refuse.file));
        expect(message).toContain(c.refuse.key);
      } else {
        const got = resolved(dir);
        expect(Object.fromEntries(Object.keys(c.expect ?? {}).map((k) => [k, got[k]]))).toEqual(c.expect as Json);
      }
    });
});

test.skipIf(skipReason(PYTORCH) !== null)("the PyTorch reference reads every case of the same table alike (python3 -m unittest)", () => {
  expect(() => runPythonModule("unittest", ["discover", "-s", "tests", "-p", "test_hf_config.py"])).not.toThrow();
});
