// The Generate view: a chat (api/v0/chat/completions) or a raw completion
// (api/v0/completions), streamed as it is generated, with every knob of
// the extended API's modes (plain, speculative, tree speculative) and each
// reply's statistics, live while it streams and the server's at the end.
import type { GenerationMode } from "../engine/types.ts";
import type { ExtendedChatCompletionChunk, ExtendedSections, ExtendedTextCompletionChunk } from "../wire/responses.ts";
import { ApiError, type ModelSummary, postStream } from "./api.ts";
import { byId, el, numberOf, stat } from "./dom.ts";
import { ReplyTiming, timingStats } from "./timing.ts";

type Kind = "chat" | "completion";

interface Message {
  role: "user" | "assistant";
  content: string;
}

/** The `stats` section of the final chunk of an api/v0 stream. */
type ServerStats = ExtendedSections["stats"];

type Chunk = ExtendedChatCompletionChunk | ExtendedTextCompletionChunk;

/** Stop strings as each input kind starts with: a chat reply ends at its line's end. */
const DEFAULT_STOP: Record<Kind, string> = { chat: "\\n", completion: "" };
const DEFAULT_MAX_TOKENS: Record<Kind, string> = { chat: "64", completion: "128" };

/** The stop field: one string per line, with \n, \t and \\ written as escapes. */
export function parseStops(field: string): string[] {
  return field
    .split("\n")
    .map((line) => line.replace(/\\(n|t|\\)/g, (_, c: string) => (c === "n" ? "\n" : c === "t" ? "\t" : "\\")))
    .filter((s) => s !== "");
}

export function setUpGenerate(model: ModelSummary): void {
  const transcript = byId("transcript");
  const prompt = byId<HTMLTextAreaElement>("prompt");
  const send = byId<HTMLButtonElement>("send");
  const stop = byId<HTMLButtonElement>("stop");
  const mode = byId<HTMLSelectElement>("k-mode");
  const loops = byId<HTMLInputElement>("k-loops");
  const draftLoops = byId<HTMLInputElement>("k-draft-loops");
  const verifyLoops = byId<HTMLInputElement>("k-verify-loops");
  const draftAhead = byId<HTMLInputElement>("k-draft-ahead");
  const branches = byId<HTMLInputElement>("k-branches");
  const temperature = byId<HTMLInputElement>("k-temperature");
  const topP = byId<HTMLInputElement>("k-top-p");
  const maxTokens = byId<HTMLInputElement>("k-max-tokens");
  const stopField = byId<HTMLTextAreaElement>("k-stop");
  const greedyNote = byId("k-greedy-note");
  const knobs = byId<HTMLFormElement>("knobs");

  const depth = String(model.defaultLoops ?? 8);
  loops.value = depth;
  verifyLoops.value = depth;
  stopField.value = DEFAULT_STOP.chat;

  let history: Message[] = [];
  let running: AbortController | null = null;
  const kind = (): Kind => ((knobs.elements.namedItem("kind") as RadioNodeList).value === "completion" ? "completion" : "chat");
  const currentMode = (): GenerationMode => mode.value as GenerationMode;

  // Only the knobs of the chosen mode are shown; the tree is greedy only.
  const showModeKnobs = () => {
    for (const label of knobs.querySelectorAll<HTMLElement>("[data-modes]"))
      label.hidden = !(label.dataset.modes ?? "").split(" ").includes(currentMode());
    const tree = currentMode() === "tree_speculative";
    temperature.disabled = tree;
    topP.disabled = tree;
    greedyNote.hidden = !tree;
  };
  mode.addEventListener("change", showModeKnobs);
  showModeKnobs();

  // Switching the input kind swaps the defaults that differ, unless they were edited.
  let lastKind: Kind = "chat";
  knobs.addEventListener("change", (e) => {
    if ((e.target as HTMLInputElement).name !== "kind") return;
    const next = kind();
    if (stopField.value === DEFAULT_STOP[lastKind]) stopField.value = DEFAULT_STOP[next];
    if (maxTokens.value === DEFAULT_MAX_TOKENS[lastKind]) maxTokens.value = DEFAULT_MAX_TOKENS[next];
    prompt.placeholder = next === "chat" ? "Who made the heaven and the earth?" : "And God said,";
    lastKind = next;
  });

  /** The request's knobs, as the extended API names them; empty fields are left to the server. */
  const knobFields = (): Record<string, unknown> => {
    const m = currentMode();
    const fields: Record<string, unknown> = {
      max_tokens: numberOf(maxTokens),
      temperature: m === "tree_speculative" ? 0 : numberOf(temperature),
      top_p: m === "tree_speculative" ? undefined : numberOf(topP),
      stop: parseStops(stopField.value),
    };
    if (m === "generate") return { ...fields, loops: numberOf(loops) };
    return {
      ...fields,
      mode: m,
      draft_loops: numberOf(draftLoops),
      verify_loops: numberOf(verifyLoops),
      draft_ahead: numberOf(draftAhead),
      ...(m === "tree_speculative" ? { K_branches: numberOf(branches) } : {}),
    };
  };

  const setRunning = (controller: AbortController | null) => {
    running = controller;
    send.disabled = controller !== null;
    stop.disabled = controller === null;
  };

  const renderStats = (into: HTMLElement, timing: ReplyTiming, server: ServerStats | null, requested: Record<string, unknown>) => {
    const figures = [
      ...timingStats(timing, server?.completion_tokens ?? timing.tokens, server?.tokens_per_second),
      stat("loops_used", "loops", String(server?.loops_used ?? requested.loops ?? requested.verify_loops ?? "–")),
    ];
    // The speculative modes' stats carry the acceptance figures.
    if (server && "draft_tokens" in server) {
      const drafted = server.draft_tokens;
      const accepted = server.accepted_tokens;
      figures.push(
        stat("accepted_per_cycle", "tokens/cycle", server.accepted_per_cycle.toFixed(2), "tokens produced per verify call: accepted drafts plus the verifier's own"),
        stat("draft_tokens", "drafted", String(drafted)),
        stat("accepted_tokens", "accepted", `${accepted}${drafted > 0 ? ` (${Math.round((100 * accepted) / drafted)}%)` : ""}`),
      );
    }
    into.replaceChildren(...figures);
  };

  const addEntry = (role: string, text = ""): HTMLElement => {
    byId("transcript-hint").hidden = true;
    const entry = el("article", `message ${role}`);
    entry.append(el("div", "role", role), el("div", "text", text));
    transcript.append(entry);
    return entry;
  };

  const run = async () => {
    const text = prompt.value;
    if (text.trim() === "" || running) return;
    if (model.id === null) {
      addEntry("error", model.description);
      return;
    }
    const k = kind();
    const requested = knobFields();
    let path: string;
    let body: Record<string, unknown>;
    if (k === "chat") {
      history.push({ role: "user", content: text });
      addEntry("user", text);
      prompt.value = "";
      path = "api/v0/chat/completions";
      body = { model: model.id, messages: history, stream: true, ...requested };
    } else {
      addEntry("prompt", text);
      path = "api/v0/completions";
      body = { model: model.id, prompt: text, stream: true, ...requested };
    }
    const entry = addEntry("assistant");
    entry.dataset.state = "streaming";
    const output = entry.querySelector<HTMLElement>(".text")!;
    const stats = el("div", "stats");
    entry.append(stats);
    const timing = new ReplyTiming();
    let reply = "";
    let server: ServerStats | null = null;
    const controller = new AbortController();
    setRunning(controller);
    renderStats(stats, timing, null, requested);
    try {
      for await (const chunk of postStream<Chunk>(path, body, controller.signal)) {
        const choice = chunk.choices[0];
        const delta = choice === undefined ? "" : "delta" in choice ? (choice.delta.content ?? "") : choice.text;
        if (delta !== "") {
          // A chat reply starts after "Assistant:", usually with a space: not part of the answer.
          reply = k === "chat" ? (reply + delta).trimStart() : reply + delta;
          output.textContent = reply;
          timing.arrived();
          transcript.scrollTop = transcript.scrollHeight;
        }
        if (chunk.stats) server = chunk.stats;
        renderStats(stats, timing, server, requested);
      }
      entry.dataset.state = "done";
    } catch (e) {
      if (controller.signal.aborted) {
        entry.dataset.state = "stopped";
        stats.append(el("span", "stat muted", "stopped"));
      } else {
        entry.dataset.state = "error";
        entry.classList.add("failed");
        entry.append(el("div", "error", e instanceof ApiError ? e.message : `request failed: ${(e as Error).message}`));
        // The turn did not happen: leave it out of the conversation the next request sends.
        if (k === "chat") history.pop();
      }
    } finally {
      setRunning(null);
    }
    if (k === "chat" && entry.dataset.state !== "error") history.push({ role: "assistant", content: reply });
  };

  byId<HTMLFormElement>("compose").addEventListener("submit", (e) => {
    e.preventDefault();
    void run();
  });
  // Enter sends, Shift+Enter starts a new line.
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      void run();
    }
  });
  stop.addEventListener("click", () => running?.abort());
  byId("clear").addEventListener("click", () => {
    running?.abort();
    history = [];
    for (const m of transcript.querySelectorAll(".message")) m.remove();
    byId("transcript-hint").hidden = false;
  });
}
