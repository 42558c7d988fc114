// Progress of long commands (src/progress.ts): the display itself on a
// stand-in stream and clock, then the real commands (model quantize, model
// export-gguf, bench) run as processes whose stderr is a pipe, not a
// terminal: plain lines, percentages that only go up, 100% last.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { formatDuration, LINE_INTERVAL_MS, Progress, type ProgressStream, withProgress } from "../src/progress.ts";
import { tinyModelPath } from "./helpers/models.ts";

const ROOT = resolve(import.meta.dir, "..");
const work = mkdtempSync(join(tmpdir(), "loopserve-progress-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function stream(tty: boolean, columns?: number): ProgressStream & { text: () => string } {
  const chunks: string[] = [];
  return { isTTY: tty, columns, write: (s: string) => chunks.push(s), text: () => chunks.join("") };
}

function clock() {
  let t = 0;
  return { now: () => t, advance: (ms: number) => void (t += ms) };
}

describe("formatDuration", () => {
  test("milliseconds, seconds, minutes, hours", () => {
    expect(formatDuration(850)).toBe("850 ms");
    expect(formatDuration(4200)).toBe("4.2 s");
    expect(formatDuration(185_000)).toBe("3 min 05 s");
    expect(formatDuration(3_720_000)).toBe("1 h 02 min");
  });
});

describe("plain lines (not a terminal)", () => {
  test("one line per tenth of the work, an ETA from the rate so far, 100% once at the end", () => {
    const out = stream(false);
    const c = clock();
    const p = new Progress("work", out, { now: c.now });
    for (let done = 1; done <= 1000; done++) {
      c.advance(10);
      p.update(done, 1000);
    }
    p.finish();
    const lines = out.text().trimEnd().split("\n");
    expect(lines[0]).toBe("work: 0% (10 ms elapsed)");
    expect(lines.slice(1, 10)).toEqual(
      Array.from({ length: 9 }, (_, i) => {
        const pct = (i + 1) * 10;
        const elapsed = pct * 100;
        return `work: ${pct}% (${formatDuration(elapsed)} elapsed, ETA ${formatDuration(elapsed * ((100 - pct) / pct))})`;
      }),
    );
    expect(lines[10]).toBe("work: 100% (done in 10.0 s)");
    expect(lines.length).toBe(11);
  });

  test("slow work still prints a line every LINE_INTERVAL_MS, and progress never goes backwards", () => {
    const out = stream(false);
    const c = clock();
    const p = new Progress("slow", out, { now: c.now });
    p.update(1, 100);
    c.advance(LINE_INTERVAL_MS - 1);
    p.update(2, 100); // under a tenth, and too soon: no line
    c.advance(1);
    p.update(3, 100); // the interval has passed
    c.advance(LINE_INTERVAL_MS);
    p.update(2, 100); // a smaller figure is ignored
    const lines = out.text().trimEnd().split("\n");
    expect(lines.map((l) => l.split(" (")[0])).toEqual(["slow: 1%", "slow: 3%"]);
  });

  test("a failure ends the display without a 100% line", () => {
    const out = stream(false);
    expect(() =>
      withProgress("fails", out, (onProgress) => {
        onProgress?.(50, 100);
        throw new Error("disk full");
      }),
    ).toThrow("disk full");
    expect(out.text()).toMatch(/^fails: 50% \(/);
    expect(out.text()).not.toContain("100%");
  });

  test("no stream, no display; the work's result is returned", () => {
    expect(withProgress("quiet", undefined, (onProgress) => (onProgress === undefined ? 42 : 0))).toBe(42);
  });
});

describe("the bar (a terminal)", () => {
  test("redrawn in place at most every 100 ms, one width fitted to the terminal, ended with a newline", () => {
    const out = stream(true, 60);
    const c = clock();
    const p = new Progress("bar", out, { now: c.now });
    p.update(1, 4);
    c.advance(50);
    p.update(2, 4); // too soon: not drawn
    c.advance(50);
    p.update(3, 4);
    p.finish();
    const draws = out.text().split("\r").filter((d) => d !== "");
    // 60 columns less the label and the room kept for the text: 13.
    expect(draws).toEqual([
      `bar [###----------]  25%  0 ms elapsed, ETA 0 ms\x1b[K`,
      `bar [##########---]  75%  100 ms elapsed, ETA 33 ms\x1b[K`,
      `bar [#############] 100%  done in 100 ms\x1b[K\n`,
    ]);
  });

  test("abandoned after a draw: the line is ended so an error message starts on its own", () => {
    const out = stream(true);
    const p = new Progress("bar", out, { now: clock().now });
    p.update(1, 2);
    p.abandon();
    expect(out.text()).toEndWith("\x1b[K\n");
  });
});

// ---- the commands, as a user runs them with stderr redirected ----

function runCli(args: string[]) {
  const p = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), ...args], {
    cwd: ROOT,
    env: { ...process.env, SERVICE_BUILD_DIR: join(ROOT, "build") },
    stdout: "pipe",
    stderr: "pipe",
  });
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
}

/** The percentages of a command's progress lines; every stderr line must be one. */
function percentages(label: string, stderr: string): number[] {
  const lines = stderr.trimEnd().split("\n");
  const re = new RegExp(`^${label}: (\\d+)% \\((.+)\\)$`);
  for (const line of lines) expect(line).toMatch(re);
  return lines.map((l) => Number(re.exec(l)![1]));
}

function expectRising(pcts: number[]): void {
  expect(pcts.length).toBeGreaterThanOrEqual(3);
  for (let i = 1; i < pcts.length; i++) expect(pcts[i]).toBeGreaterThan(pcts[i - 1]);
  expect(pcts.at(-1)).toBe(100);
  expect(pcts.filter((p) => p === 100).length).toBe(1);
}

describe("long commands report progress on stderr", () => {
  test("model quantize", () => {
    const out = join(work, "q.safetensors");
    // A small vocabulary, so the block's matrices (progress per quantizer call) are most of the work, not one head call.
    const r = runCli(["model", "quantize", tinyModelPath({ vocabSize: 512, dim: 128, ffnDim: 256 }), out, "--quant", "int4"]);
    expect(r.code).toBe(0);
    expect(r.out).toStartWith(`wrote ${out}`);
    expectRising(percentages("quantize", r.err));
    expect(r.err.trimEnd().split("\n").at(-1)).toMatch(/^quantize: 100% \(done in .+\)$/);
  });

  test("model export-gguf", () => {
    const out = join(work, "m.gguf");
    // A small vocabulary, so the unrolled layers (not the embedding) are most of the file.
    const model = tinyModelPath({ vocabSize: 512, dim: 128, ffnDim: 256 });
    const r = runCli(["model", "export-gguf", model, out, "--loops", "8"]);
    expect(r.code).toBe(0);
    expect(existsSync(out)).toBe(true);
    expectRising(percentages("export-gguf", r.err));
  });

  test("bench", () => {
    const r = runCli(["bench", "--model", tinyModelPath(), "--threads", "1", "--prefill", "8", "--decode", "40"]);
    expect(r.code).toBe(0);
    expect(r.out).toContain("decode tok/s");
    expectRising(percentages("bench", r.err));
  });

  test("a failing command prints its error and no 100% line", () => {
    const r = runCli(["model", "quantize", join(work, "missing.safetensors"), join(work, "x.safetensors"), "--quant", "int4"]);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/^error: .*missing\.safetensors/m);
    expect(r.err).not.toContain("100%");
  });
});
