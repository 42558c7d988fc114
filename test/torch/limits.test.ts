// The PyTorch package refuses a config the kernels would refuse: its caps
// (torch/loopserve_torch/model.py) are kernels/loopserve.h's LS_MAX_*, here
// read through the constants build.ts generates from the header (which
// test/engine/abi.test.ts keeps current), and its checks use them.
import { expect, setDefaultTimeout, test } from "bun:test";
import * as abi from "../../src/abi/abi.generated.ts";
import { PYTORCH, skipReason } from "../helpers/system_packages.ts";
import { runPython } from "../helpers/torch.ts";

setDefaultTimeout(60_000); // importing torch takes seconds on a busy machine

/** The package's caps, and LoopedConfig's verdict ("ok" or its message) on each config. */
function readPackage(configs: Record<string, number>[]): { caps: Record<string, number>; verdicts: string[] } {
  const code = `
import json
from loopserve_torch import model as m
def verdict(fields):
    try:
        m.LoopedConfig(**fields)
        return "ok"
    except ValueError as e:
        return str(e)
caps = {"loops": m.MAX_LOOPS, **m.LIMITS, "rope_theta": m.MAX_ROPE_THETA, "norm_eps": m.MAX_NORM_EPS}
print(json.dumps({"caps": caps, "verdicts": [verdict(c) for c in json.loads(${JSON.stringify(JSON.stringify(configs))})]}))
`;
  return JSON.parse(runPython(["-c", code]));
}

test.skipIf(skipReason(PYTORCH) !== null)("the PyTorch package's model caps are kernels/loopserve.h's LS_MAX_*, and its config checks use them", () => {
  const { caps, verdicts } = readPackage([
    { default_loops: abi.LS_MAX_LOOPS },
    { default_loops: abi.LS_MAX_LOOPS + 1 },
    { vocab_size: abi.LS_MAX_VOCAB + 1 },
    { norm_eps: abi.LS_MAX_NORM_EPS },
  ]);
  expect(caps).toEqual({
    loops: abi.LS_MAX_LOOPS,
    dim: abi.LS_MAX_DIM,
    n_heads: abi.LS_MAX_HEADS,
    n_kv_heads: abi.LS_MAX_HEADS,
    ffn_dim: abi.LS_MAX_FFN_DIM,
    vocab_size: abi.LS_MAX_VOCAB,
    max_seq_len: abi.LS_MAX_SEQ_LEN,
    rope_theta: abi.LS_MAX_ROPE_THETA,
    norm_eps: abi.LS_MAX_NORM_EPS,
  });
  expect(verdicts).toEqual([
    "ok",
    `default_loops must be in [1, ${abi.LS_MAX_LOOPS}], got ${abi.LS_MAX_LOOPS + 1}`,
    `vocab_size must be in [1, ${abi.LS_MAX_VOCAB}], got ${abi.LS_MAX_VOCAB + 1}`,
    `norm_eps must be in (0, 1), got ${abi.LS_MAX_NORM_EPS}`,
  ]);
});
