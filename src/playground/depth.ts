// The depth explorer: one prompt run at several loop depths, side by side.
// A looped model applies its one block `loops` times, so the same weights
// answer at every depth; this view shows what depth changes. Each depth is
// a native streaming /generate request (its events carry token ids), run
// one after another so their timings do not share the machine: the deepest
// first, as every other column is compared with it token by token.
import type { GenerateStreamEvent } from "../wire/responses.ts";
import { agreement } from "./agreement.ts";
import { ApiError, type ModelSummary, postStream } from "./api.ts";
import { byId, el, numberOf, stat } from "./dom.ts";
import { ReplyTiming, timingStats } from "./timing.ts";

const MAX_COLUMNS = 8;
const MAX_LOOPS = 64;

/** 1, 2, 4, ... below the model's default depth, then the default itself: 8 gives 1, 2, 4, 8. */
export function defaultDepths(defaultLoops: number): number[] {
  const depths: number[] = [];
  for (let d = 1; d < defaultLoops; d *= 2) depths.push(d);
  depths.push(defaultLoops);
  return depths;
}

/** "1, 2, 4, 8" → [1, 2, 4, 8]: distinct depths in 1..64, ascending, at most 8; else an error message. */
export function parseDepths(field: string): number[] | string {
  const parts = field.split(/[\s,]+/).filter((p) => p !== "");
  if (parts.length === 0) return "give at least one loop depth, e.g. 1, 2, 4, 8";
  const depths = new Set<number>();
  for (const p of parts) {
    const n = Number(p);
    if (!Number.isInteger(n) || n < 1 || n > MAX_LOOPS) return `loop depths are whole numbers from 1 to ${MAX_LOOPS}; got "${p}"`;
    depths.add(n);
  }
  if (depths.size > MAX_COLUMNS) return `at most ${MAX_COLUMNS} depths at once; got ${depths.size}`;
  return [...depths].sort((a, b) => a - b);
}

interface Column {
  loops: number;
  root: HTMLElement;
  text: HTMLElement;
  stats: HTMLElement;
  tokens: number[];
  spans: HTMLSpanElement[];
}

function makeColumn(loops: number, reference: boolean): Column {
  const root = el("article", "depth-column");
  root.dataset.loops = String(loops);
  root.dataset.state = "waiting";
  const head = el("header", "column-head");
  head.append(el("h3", "", `loops ${loops}`));
  if (reference) head.append(el("span", "badge", "reference"));
  const stats = el("div", "stats");
  const text = el("div", "tokens");
  root.append(head, stats, text);
  return { loops, root, text, stats, tokens: [], spans: [] };
}

export function setUpDepthExplorer(model: ModelSummary): void {
  const form = byId<HTMLFormElement>("depth-form");
  const prompt = byId<HTMLTextAreaElement>("d-prompt");
  const depthsField = byId<HTMLInputElement>("d-depths");
  const maxTokens = byId<HTMLInputElement>("d-max-tokens");
  const temperature = byId<HTMLInputElement>("d-temperature");
  const runButton = byId<HTMLButtonElement>("d-run");
  const stopButton = byId<HTMLButtonElement>("d-stop");
  const status = byId("d-status");
  const columnsBox = byId("depth-columns");
  depthsField.value = defaultDepths(model.defaultLoops ?? 8).join(", ");

  let running: AbortController | null = null;

  const showStats = (c: Column, timing: ReplyTiming, reference: Column | null) => {
    const figures = timingStats(timing, c.tokens.length);
    if (reference && c.root.dataset.state === "done") {
      const a = agreement(c.tokens, reference.tokens);
      const pct = a.compared > 0 ? Math.round((100 * a.matched) / a.compared) : 100;
      const where = a.firstDivergence === null ? "identical" : `first differs at token ${a.firstDivergence + 1}`;
      figures.push(
        stat("agreement", "agrees", `${pct}% (${a.matched}/${a.compared})`, `token-by-token agreement with loops ${reference.loops}; ${where}`),
        stat("first_divergence", "first diff", a.firstDivergence === null ? "none" : `token ${a.firstDivergence + 1}`),
      );
    }
    c.stats.replaceChildren(...figures);
  };

  /** Streams one depth into its column; `reference` (already complete) colours each token as it arrives. */
  const runColumn = async (c: Column, reference: Column | null, signal: AbortSignal) => {
    c.root.dataset.state = "streaming";
    const timing = new ReplyTiming();
    const body = {
      prompt: prompt.value,
      loops: c.loops,
      max_tokens: numberOf(maxTokens),
      temperature: numberOf(temperature),
      stream: true,
    };
    showStats(c, timing, reference);
    try {
      for await (const event of postStream<GenerateStreamEvent>("generate", body, signal)) {
        if (event.token_id < 0) {
          // The held-back tail belongs to the last token's text.
          if (event.text !== "") c.spans.at(-1)?.append(event.text);
          continue;
        }
        const i = c.tokens.length;
        c.tokens.push(event.token_id);
        const span = el("span", "tok", event.text);
        span.title = `token ${i + 1}: id ${event.token_id}`;
        if (reference) span.classList.add(reference.tokens[i] === event.token_id ? "same" : "diff");
        c.spans.push(span);
        c.text.append(span);
        timing.arrived();
        showStats(c, timing, reference);
      }
      c.root.dataset.state = "done";
      showStats(c, timing, reference);
    } catch (e) {
      c.root.dataset.state = signal.aborted ? "stopped" : "error";
      if (!signal.aborted) c.root.append(el("div", "error", e instanceof ApiError ? e.message : `request failed: ${(e as Error).message}`));
      throw e;
    }
  };

  const run = async () => {
    if (running) return;
    const depths = parseDepths(depthsField.value);
    if (typeof depths === "string") {
      status.textContent = depths;
      status.dataset.state = "error";
      return;
    }
    if (prompt.value.trim() === "") {
      status.textContent = "write a prompt first";
      status.dataset.state = "error";
      return;
    }
    const deepest = depths[depths.length - 1];
    const columns = depths.map((d) => makeColumn(d, d === deepest));
    columnsBox.replaceChildren(...columns.map((c) => c.root));
    const reference = columns[columns.length - 1];
    const controller = new AbortController();
    running = controller;
    runButton.disabled = true;
    stopButton.disabled = false;
    status.dataset.state = "running";
    try {
      status.textContent = `loops ${deepest} (the reference)…`;
      await runColumn(reference, null, controller.signal);
      for (const c of columns.slice(0, -1)) {
        status.textContent = `loops ${c.loops}…`;
        await runColumn(c, reference, controller.signal);
      }
      status.textContent = `done: ${depths.length} depths, each compared with loops ${deepest}`;
      status.dataset.state = "done";
    } catch (e) {
      status.textContent = controller.signal.aborted ? "stopped" : e instanceof ApiError ? e.message : `request failed: ${(e as Error).message}`;
      status.dataset.state = controller.signal.aborted ? "stopped" : "error";
      for (const c of columns) if (c.root.dataset.state === "waiting") c.root.dataset.state = "skipped";
    } finally {
      running = null;
      runButton.disabled = false;
      stopButton.disabled = true;
    }
  };

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    void run();
  });
  stopButton.addEventListener("click", () => running?.abort());
}
