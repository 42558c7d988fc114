// `bun run bench:gpu`: the GPU validation run, for hosts that have bun. It
// is bench/gpu/validate.sh, the script a bare GPU host runs without bun
// (docs/gpu.md): both libraries built with make, the CUDA library held to
// the CPU library by the C driver, compute-sanitizer, the timings beside
// the PyTorch peer, one JSON with the targets (bench/results/gpu.json, and a
// dated copy in bench/gpu-runs/ to commit with the change it measured).
//
//   bun run bench:gpu [-- --no-gpu] [-- --quick] [-- --out DIR] [-- --commit SHA]
import { spawnSync } from "node:child_process";
import { join } from "node:path";

const r = spawnSync("bash", [join(import.meta.dir, "gpu", "validate.sh"), ...process.argv.slice(2)], { stdio: "inherit" });
process.exit(r.status ?? 1);
