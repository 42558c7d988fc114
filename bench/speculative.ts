// Self-speculative decoding: greedy tokens/s of the speculative chain and
// tree against plain decoding at the same verify depth, with the mean number
// of tokens each verify call produced (accepted drafts + the verifier's own),
// on the dim-768 benchmark shape: once with small residual updates per loop
// (shallow loops agree with deep ones, so drafts are accepted) and once on
// the plain random model (drafts mostly rejected). Every speculative run is
// checked token for token against the plain run. The tree runs twice: with
// every top-K candidate as a leaf (the default), and pruned to leaves the
// draft gives at least 10% (Engine option draft.treeLeafMinProb).
//
//   bun bench/speculative.ts            the full table (a few minutes on 2 cores)
import { NativeModel, type NativeSession } from "../src/engine/binding.ts";
import { GREEDY as PLAIN_GREEDY } from "../src/engine/types.ts";
import { kernelLibrary } from "../src/cli/bench/engine.ts";
import { benchModel, promptOf } from "../src/cli/bench/models.ts";
import { median, printTable, type Row } from "../src/cli/bench/table.ts";

export interface SpeculativeBenchOptions {
  threads?: number; // kernel threads (default 2)
  verifyLoops?: number[]; // default 8, 16, 32
  draftLoops?: number[]; // default 1, 2, 4
  draftAhead?: number; // chain: tokens drafted per cycle (default 4, the API default)
  treeBranches?: number; // tree: K_branches (default 4)
  treeAhead?: number; // tree depth (default 4: 16 nodes)
  leafMinProb?: number; // pruned tree's leaf threshold (default 0.1)
  decodeTokens?: number; // tokens generated per run (default 40)
  promptTokens?: number; // default 32
  repeats?: number; // runs per point, median taken (default 3)
  agreeingScale?: number; // residualScale of the "agreeing" model (default 0.01)
  library?: string;
}

export interface Run {
  tokens: number[];
  tokensPerSecond: number;
  perCycle: number; // tokens per verify call (accepted drafts + the verifier's own)
  drafted: number; // draft tokens proposed, over all cycles
  accepted: number; // draft tokens accepted
}

/** Sampling of a decode run: temperature 0 is greedy (the seed is then unused). */
export interface Sampling {
  temperature: number;
  seed: number;
}
export const GREEDY: Sampling = { temperature: 0, seed: 0 };

/**
 * Decodes n tokens after the prompt, plainly (spec null) or self-speculatively;
 * the clock runs from the first token on (prefill excluded).
 */
export function decode(
  m: NativeModel,
  prompt: Int32Array,
  V: number,
  n: number,
  spec: { D: number; k: number; K: number; leaf?: number } | null,
  sampling: Sampling = GREEDY,
): Run {
  const session: NativeSession = m.newSession(prompt.length + n + 65, V, 0);
  const params = { ...PLAIN_GREEDY, ...sampling };
  try {
    const tokens = [session.step(prompt, V, params)];
    const out = new Int32Array(17);
    const stats = { drafted: 0, accepted: 0 };
    let drafted = 0;
    let accepted = 0;
    let cycles = 0;
    const t0 = performance.now();
    while (tokens.length < n) {
      const last = tokens[tokens.length - 1];
      if (!spec) {
        tokens.push(session.step(Int32Array.of(last), V, params));
        continue;
      }
      const got = session.specCycle(
        last,
        {
          draftLoops: spec.D,
          verifyLoops: V,
          draftAhead: spec.k,
          kBranches: spec.K,
          maxNew: n - tokens.length,
          sampling: params,
          leafMinProb: spec.leaf ?? 0,
        },
        out,
        stats,
      );
      tokens.push(...out.subarray(0, got));
      drafted += stats.drafted;
      accepted += stats.accepted;
      cycles++;
    }
    const ms = performance.now() - t0;
    return { tokens, tokensPerSecond: ((n - 1) * 1000) / ms, perCycle: cycles > 0 ? (n - 1) / cycles : 1, drafted, accepted };
  } finally {
    session.close();
  }
}

export const same = (a: number[], b: number[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/** One row per (model, verify_loops, draft_loops). */
export async function measureSpeculative(o: SpeculativeBenchOptions = {}): Promise<Row[]> {
  const threads = o.threads ?? 2;
  const Vs = o.verifyLoops ?? [8, 16, 32];
  const Ds = o.draftLoops ?? [1, 2, 4];
  const k = o.draftAhead ?? 4;
  const K = o.treeBranches ?? 4;
  const tk = o.treeAhead ?? 4;
  const leaf = o.leafMinProb ?? 0.1;
  const n = o.decodeTokens ?? 40;
  const repeats = o.repeats ?? 3;
  const scale = o.agreeingScale ?? 0.01;
  const models: [string, string][] = [
    [`agreeing (residualScale ${scale})`, await benchModel({ residualScale: scale })],
    ["random (residualScale 1)", await benchModel()],
  ];
  const rows: Row[] = [];
  for (const [name, path] of models) {
    const m = NativeModel.load(o.library ?? kernelLibrary(), path, threads, "auto");
    try {
      const prompt = promptOf(o.promptTokens ?? 32, m.info.vocabSize);
      decode(m, prompt, 2, 8, { D: 1, k: 2, K: 1 }); // builds the int8 draft head once
      for (const V of Vs) {
        for (const D of Ds.filter((d) => d <= V)) {
          // Plain, chain and tree interleaved, repeat by repeat: a shared
          // machine's load drifts, and a point is compared with its neighbours.
          const plain: Run[] = [];
          const chain: Run[] = [];
          const tree: Run[] = [];
          const pruned: Run[] = [];
          for (let r = 0; r < repeats; r++) {
            plain.push(decode(m, prompt, V, n, null));
            chain.push(decode(m, prompt, V, n, { D, k, K: 1 }));
            tree.push(decode(m, prompt, V, n, { D, k: tk, K }));
            pruned.push(decode(m, prompt, V, n, { D, k: tk, K, leaf }));
          }
          const exact = [...chain, ...tree, ...pruned].every((r) => same(r.tokens, plain[0].tokens));
          const tps = (runs: Run[]) => median(runs.map((r) => r.tokensPerSecond));
          // Speed-up: the median over repeats of each run against the plain
          // run just before it (neighbours share the machine's load).
          const speedup = (runs: Run[]) => median(runs.map((r, i) => r.tokensPerSecond / plain[i].tokensPerSecond));
          const p = tps(plain);
          rows.push({
            model: name,
            verify_loops: V,
            draft_loops: D,
            "plain tok/s": p,
            [`chain k${k} tok/s`]: tps(chain),
            "chain acc/cycle": chain[0].perCycle,
            "chain speed-up": speedup(chain),
            [`tree K${K}xk${tk} tok/s`]: tps(tree),
            "tree acc/cycle": tree[0].perCycle,
            "tree speed-up": speedup(tree),
            [`pruned >=${leaf} tok/s`]: tps(pruned),
            "pruned acc/cycle": pruned[0].perCycle,
            "pruned speed-up": speedup(pruned),
            exact: exact ? "yes" : "NO",
          });
        }
      }
    } finally {
      m.close();
    }
  }
  return rows;
}

if (import.meta.main) {
  const rows = await measureSpeculative();
  printTable("self-speculative decoding, dim 768 bench shape, 2 threads, greedy, 40 tokens (median of 3)", rows);
}
