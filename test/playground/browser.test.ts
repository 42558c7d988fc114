// The web playground driven in a real headless Chromium (puppeteer-core and
// Debian's /usr/bin/chromium) against a real server with the trained demo
// model: a chat reply streams in (its text grows while it is generated),
// the loops knob changes the reply's loops_used, the speculative modes
// report drafts and acceptance, a refused request shows the server's
// message, the depth explorer fills every column with agreement figures
// that match the server's own tokens, the metrics panel follows /metrics,
// no console or page error occurs, and a 375 px window needs no horizontal
// scrolling. Against a server whose model failed to load, the page says why.
// Screenshots are written under build/test-output/playground/.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { GenerateResponse } from "../../src/wire/responses.ts";
import { TRAINED_MODEL_PATH } from "../../src/model/trained.ts";
import { agreement } from "../../src/playground/agreement.ts";
import { jsonBody } from "../helpers/http.ts";
import { testTempDir } from "../helpers/models.ts";
import { type ServerOptions, startServer, type TestServer } from "../helpers/server.ts";

const CHROMIUM = "/usr/bin/chromium";
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium) console.warn(`skipping the playground's browser tests: ${CHROMIUM} is missing (Debian package chromium; .ci/system-deps.sh installs it)`);

const SHOTS = resolve(import.meta.dir, "../../build/test-output/playground");
const WAIT_MS = 90_000;

let server: TestServer;
let browser: Browser;
let page: Page;
/** Console errors and warnings, page errors and failed requests, each with the step it happened in. */
const problems: { step: string; text: string }[] = [];
let step = "load";

async function shot(name: string): Promise<void> {
  const path = join(SHOTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot: ${path}`);
}

/** Sets a form field as typing would, with the input and change events. */
async function setField(selector: string, value: string): Promise<void> {
  await page.$eval(
    selector,
    (node, v) => {
      const field = node as HTMLInputElement | HTMLTextAreaElement;
      field.value = v;
      field.dispatchEvent(new Event("input", { bubbles: true }));
      field.dispatchEvent(new Event("change", { bubbles: true }));
    },
    value,
  );
}

/** The text of the last element matching `selector`, or null without one. */
async function lastText(selector: string): Promise<string | null> {
  return page.$$eval(selector, (nodes) => nodes.at(-1)?.textContent ?? null);
}

/** The state of the last reply (streaming, done, stopped, error). */
async function lastReplyState(): Promise<string | undefined> {
  return page.$$eval(".message.assistant", (nodes) => (nodes.at(-1) as HTMLElement | undefined)?.dataset.state);
}

/** The figures of the last reply's stats line, by data-stat name, without their labels. */
async function lastReplyStats(): Promise<Record<string, string>> {
  return page.$$eval(".message.assistant", (replies) =>
    Object.fromEntries(
      [...(replies.at(-1)?.querySelectorAll<HTMLElement>(".stats [data-stat]") ?? [])].map((n) => [
        n.dataset.stat,
        (n.textContent ?? "").slice((n.querySelector("b")?.textContent ?? "").length).trim(),
      ]),
    ),
  );
}

/** Sends the prompt box's text and waits for the reply to end; returns its final state. */
async function sendAndWait(text: string): Promise<string> {
  const before = await page.$$eval(".message.assistant", (n) => n.length);
  await setField("#prompt", text);
  await page.click("#send");
  await page.waitForFunction(
    (n) => {
      const replies = document.querySelectorAll<HTMLElement>(".message.assistant");
      const state = replies[n]?.dataset.state;
      return state !== undefined && state !== "streaming";
    },
    { timeout: WAIT_MS, polling: 50 },
    before,
  );
  return (await lastReplyState()) ?? "";
}

const launchChromium = () => puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });

/**
 * A server and a browser of a describe block's own; `open()` loads the page
 * in a new tab, waits until it is ready and collects its script errors.
 */
function ownServerAndBrowser(options: ServerOptions): () => Promise<{ p: Page; scriptErrors: string[] }> {
  let own: TestServer | undefined;
  let ownBrowser: Browser | undefined;
  beforeAll(async () => {
    own = await startServer(options);
    ownBrowser = await launchChromium();
  }, 120_000);
  afterAll(async () => {
    await ownBrowser?.close();
    await own?.stop();
  });
  return async () => {
    if (!own || !ownBrowser) throw new Error("the server or the browser did not start");
    const p = await ownBrowser.newPage();
    const scriptErrors: string[] = [];
    p.on("pageerror", (e) => scriptErrors.push((e as Error).message));
    await p.goto(`${own.url}/`, { waitUntil: "load" });
    await p.waitForSelector("body[data-ready=true]", { timeout: WAIT_MS });
    return { p, scriptErrors };
  };
}

describe.skipIf(!haveChromium)("the playground in Chromium", () => {
  beforeAll(async () => {
    mkdirSync(SHOTS, { recursive: true });
    server = await startServer({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512" } });
    browser = await launchChromium();
    page = await browser.newPage();
    page.on("console", (m) => {
      if (m.type() === "error" || m.type() === "warn") problems.push({ step, text: `console ${m.type()}: ${m.text()}` });
    });
    page.on("pageerror", (e) => problems.push({ step, text: `page error: ${(e as Error).message}` }));
    page.on("requestfailed", (r) => {
      // A request the page aborted itself (the Stop button) is not a failure.
      if (r.failure()?.errorText !== "net::ERR_ABORTED") problems.push({ step, text: `request failed: ${r.url()} ${r.failure()?.errorText}` });
    });
    await page.setViewport({ width: 1280, height: 900 });
    await page.goto(`${server.url}/`, { waitUntil: "load" });
    await page.waitForSelector("body[data-ready=true]", { timeout: WAIT_MS });
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await server?.stop();
  });

  test("the page describes the model and starts from its default depth", async () => {
    const line = await page.$eval("#model-line", (n) => n.textContent ?? "");
    expect(line).toContain("kjv-looped-256.safetensors");
    expect(line).toContain("default loops 8");
    expect(await page.$eval("#k-loops", (n) => (n as HTMLInputElement).value)).toBe("8");
    expect(await page.$eval("#k-verify-loops", (n) => (n as HTMLInputElement).value)).toBe("8");
    expect(await page.$eval("#d-depths", (n) => (n as HTMLInputElement).value)).toBe("1, 2, 4, 8");
    // Only the plain mode's knob is shown until another mode is chosen.
    expect(await page.$eval("#k-draft-loops", (n) => (n as HTMLElement).offsetParent === null)).toBe(true);
  });

  test("a chat reply streams in: its text grows while the reply is still streaming", async () => {
    step = "chat";
    // A long reply with no stop string, so it streams for a while.
    await setField("#k-max-tokens", "200");
    await setField("#k-stop", "");
    await page.evaluate(() => {
      const seen: { length: number; state: string }[] = [];
      (window as unknown as { seen: typeof seen }).seen = seen;
      new MutationObserver(() => {
        const reply = [...document.querySelectorAll<HTMLElement>(".message.assistant")].at(-1);
        if (reply) seen.push({ length: reply.querySelector(".text")?.textContent?.length ?? 0, state: reply.dataset.state ?? "" });
      }).observe(document.getElementById("transcript")!, { childList: true, subtree: true, characterData: true, attributes: true });
    });
    expect(await sendAndWait("Who made the heaven and the earth?")).toBe("done");
    const seen = await page.evaluate(() => (window as unknown as { seen: { length: number; state: string }[] }).seen);
    const whileStreaming = [...new Set(seen.filter((s) => s.state === "streaming" && s.length > 0).map((s) => s.length))];
    const final = (await lastText(".message.assistant .text")) ?? "";
    expect(final.length).toBeGreaterThan(100);
    // Several partial texts, each longer than the last, all shorter than the whole.
    expect(whileStreaming.length).toBeGreaterThanOrEqual(3);
    for (let i = 1; i < whileStreaming.length; i++) expect(whileStreaming[i]).toBeGreaterThan(whileStreaming[i - 1]);
    expect(whileStreaming.at(-1)!).toBeLessThanOrEqual(final.length);
    expect(whileStreaming[0]).toBeLessThan(final.length);
    // The user's message is shown, and the reply's statistics.
    expect(await lastText(".message.user .text")).toBe("Who made the heaven and the earth?");
    const stats = await lastReplyStats();
    expect(Number(stats.tokens)).toBe(200);
    expect(Number(stats.tokens_per_second)).toBeGreaterThan(0);
    expect(stats.ttft).toMatch(/^[\d.]+ ms$/);
    expect(stats.loops_used).toBe("8");
    await shot("chat");
  }, 120_000);

  test("changing loops changes the reply's loops_used", async () => {
    step = "loops";
    // A fresh conversation, so the prompt stays well inside the model's 512-token context.
    await page.click("#clear");
    expect(await page.$$eval(".message", (n) => n.length)).toBe(0);
    await setField("#k-max-tokens", "24");
    await setField("#k-stop", "\\n");
    await setField("#k-loops", "2");
    expect(await sendAndWait("And what said he?")).toBe("done");
    expect((await lastReplyStats()).loops_used).toBe("2");
    await setField("#k-loops", "5");
    expect(await sendAndWait("Say on.")).toBe("done");
    expect((await lastReplyStats()).loops_used).toBe("5");
  }, 120_000);

  test("speculative and tree modes report the verify depth, drafts and acceptance", async () => {
    step = "speculative";
    await page.select("#k-mode", "speculative");
    expect(await page.$eval("#k-loops", (n) => (n as HTMLElement).offsetParent === null)).toBe(true);
    await setField("#k-draft-loops", "2");
    await setField("#k-verify-loops", "6");
    await setField("#k-max-tokens", "32");
    await setField("#k-stop", "");
    expect(await sendAndWait("Tell me of Moses.")).toBe("done");
    const spec = await lastReplyStats();
    expect(spec.loops_used).toBe("6");
    expect(Number(spec.draft_tokens)).toBeGreaterThan(0);
    expect(spec.accepted_tokens).toMatch(/^\d+ \(\d+%\)$/);
    expect(Number(spec.accepted_per_cycle)).toBeGreaterThanOrEqual(1);

    await page.select("#k-mode", "tree_speculative");
    // The tree is greedy only: temperature is fixed at 0 and said so.
    expect(await page.$eval("#k-temperature", (n) => (n as HTMLInputElement).disabled)).toBe(true);
    expect(await page.$eval("#k-greedy-note", (n) => (n as HTMLElement).hidden)).toBe(false);
    await setField("#k-branches", "2");
    expect(await sendAndWait("And Aaron?")).toBe("done");
    const tree = await lastReplyStats();
    expect(tree.loops_used).toBe("6");
    expect(Number(tree.draft_tokens)).toBeGreaterThan(0);
    await shot("speculative");
  }, 120_000);

  test("a refused request shows the server's message, and the next one works", async () => {
    step = "refused";
    await page.select("#k-mode", "speculative");
    // Out of the interface's range 1-32: the server refuses it.
    await setField("#k-draft-loops", "40");
    await setField("#k-verify-loops", "4");
    expect(await sendAndWait("Again.")).toBe("error");
    const message = (await lastText(".message.assistant .error")) ?? "";
    expect(message).toContain("draft_loops");
    expect(message).toContain("HTTP 400");
    step = "after refused";
    await setField("#k-draft-loops", "2");
    expect(await sendAndWait("Again.")).toBe("done");
  }, 120_000);

  test("Stop ends a reply early, keeps what arrived, and the server cancels the request", async () => {
    step = "stop";
    await page.click("#clear");
    await page.select("#k-mode", "generate");
    // 32 loops: four times the work per token of the default depth, so the
    // 450-token reply is still streaming when Stop is clicked however fast
    // the machine. Greedy, so the reply is the same long one every run (no
    // early end of text).
    await setField("#k-loops", "32");
    await setField("#k-temperature", "0");
    await setField("#k-max-tokens", "450");
    await setField("#prompt", "Speak at length.");
    await page.click("#send");
    await page.waitForFunction(() => ([...document.querySelectorAll(".message.assistant .text")].at(-1)?.textContent ?? "").length > 0, {
      timeout: WAIT_MS,
      polling: 20,
    });
    await page.click("#stop");
    await page.waitForFunction(() => [...document.querySelectorAll<HTMLElement>(".message.assistant")].at(-1)?.dataset.state !== "streaming", {
      timeout: WAIT_MS,
    });
    expect(await lastReplyState()).toBe("stopped");
    const tokens = Number((await lastReplyStats()).tokens);
    expect(tokens).toBeGreaterThan(0);
    expect(tokens).toBeLessThan(450);
    expect(((await lastText(".message.assistant .text")) ?? "").length).toBeGreaterThan(0);
    expect(await page.$eval("#send", (n) => (n as HTMLButtonElement).disabled)).toBe(false);
    // The server notices the closed connection at its next step.
    const cancelled = async () => Number(/^service_requests_cancelled_total (\d+)/m.exec(await (await fetch(`${server.url}/metrics`)).text())?.[1]);
    for (let i = 0; i < 300 && (await cancelled()) < 1; i++) await Bun.sleep(100);
    expect(await cancelled()).toBe(1);
    await setField("#k-temperature", "0.8");
  }, 120_000);

  test("completion mode continues a text", async () => {
    step = "completion";
    await page.click('input[name=kind][value="completion"]');
    // The chat's stop string is swapped for none, the token budget for the completion default.
    expect(await page.$eval("#k-stop", (n) => (n as HTMLTextAreaElement).value)).toBe("");
    await setField("#k-max-tokens", "32");
    expect(await sendAndWait("And God said, Let there be light:")).toBe("done");
    expect(await lastText(".message.prompt .text")).toBe("And God said, Let there be light:");
    expect(((await lastText(".message.assistant .text")) ?? "").length).toBeGreaterThan(0);
    expect(Number((await lastReplyStats()).tokens)).toBe(32);
  }, 120_000);

  test("the depth explorer fills every column, with agreement figures that match the server's tokens", async () => {
    step = "depth";
    await page.click("#tab-depth");
    expect(await page.$eval("#panel-generate", (n) => (n as HTMLElement).hidden)).toBe(true);
    // The first /metrics read after these requests finish shows a rate above zero, for 2 s.
    const rateSeen = page
      .waitForFunction(() => Number(document.getElementById("m-rate")?.textContent) > 0, { timeout: WAIT_MS, polling: 50 })
      .then(
        () => true,
        () => false,
      );
    await page.click("#d-run");
    await page.waitForFunction(() => ["done", "error"].includes(document.getElementById("d-status")?.dataset.state ?? ""), {
      timeout: WAIT_MS,
      polling: 100,
    });
    expect(await page.$eval("#d-status", (n) => n.textContent)).toContain("done");
    const columns = await page.$$eval(".depth-column", (nodes) =>
      nodes.map((n) => {
        const c = n as HTMLElement;
        const stats = Object.fromEntries(
          [...c.querySelectorAll<HTMLElement>("[data-stat]")].map((s) => [
            s.dataset.stat,
            (s.textContent ?? "").slice((s.querySelector("b")?.textContent ?? "").length).trim(),
          ]),
        );
        const tokens = [...c.querySelectorAll<HTMLElement>(".tok")];
        return {
          loops: Number(c.dataset.loops),
          state: c.dataset.state,
          reference: c.querySelector(".badge") !== null,
          stats,
          tokens: tokens.length,
          same: tokens.map((t) => t.classList.contains("same")),
        };
      }),
    );
    expect(columns.map((c) => c.loops)).toEqual([1, 2, 4, 8]);
    expect(columns.every((c) => c.state === "done")).toBe(true);
    expect(columns.map((c) => c.reference)).toEqual([false, false, false, true]);

    // The server's greedy tokens at each depth, compared here the same way.
    const prompt = await page.$eval("#d-prompt", (n) => (n as HTMLTextAreaElement).value);
    const tokensAt = async (loops: number) => {
      const r = await server.post("/generate", { prompt, loops, max_tokens: 48, temperature: 0 });
      return (await jsonBody(r, GenerateResponse)).tokens;
    };
    const reference = await tokensAt(8);
    for (const c of columns) {
      expect(Number(c.stats.tokens)).toBe(c.tokens);
      expect(Number(c.stats.tokens_per_second)).toBeGreaterThan(0);
      if (c.reference) {
        expect(c.stats.agreement).toBeUndefined();
        continue;
      }
      const a = agreement(await tokensAt(c.loops), reference);
      expect(c.stats.agreement).toBe(`${Math.round((100 * a.matched) / a.compared)}% (${a.matched}/${a.compared})`);
      expect(c.stats.first_divergence).toBe(a.firstDivergence === null ? "none" : `token ${a.firstDivergence + 1}`);
      expect(c.same).toEqual(a.same);
    }
    await shot("depth-explorer");
    expect(await rateSeen).toBe(true);
  }, 120_000);

  test("the metrics panel follows /metrics", async () => {
    step = "metrics";
    const completed = async () => Number(await page.$eval("#m-completed", (n) => n.textContent));
    const served = Number(/^service_requests_completed_total (\d+)/m.exec(await (await fetch(`${server.url}/metrics`)).text())?.[1]);
    // The panel scrapes every 2 s: it catches up with the server's count.
    await page.waitForFunction((n) => Number(document.getElementById("m-completed")?.textContent) >= n, { timeout: WAIT_MS, polling: 100 }, served);
    expect(await completed()).toBeGreaterThanOrEqual(served);
    expect(await page.$eval("#m-queue", (n) => n.textContent)).toBe("0");
    expect(await page.$eval("#m-inflight", (n) => n.textContent)).toMatch(/^[01]$/);
    expect(await page.$eval("#m-spec", (n) => n.textContent)).toMatch(/^\d+ \/ \d+ \(\d+%\)$/);
    expect(await page.$eval("#metrics", (n) => (n as HTMLElement).dataset.state)).toBe("ok");
  }, 120_000);

  test("a 375 px window needs no horizontal scrolling", async () => {
    step = "narrow";
    await page.setViewport({ width: 375, height: 800 });
    const overflow = () => page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    expect(await overflow()).toBe(0);
    await shot("narrow-depth-explorer");
    await page.click("#tab-generate");
    expect(await overflow()).toBe(0);
    await shot("narrow-generate");
  }, 120_000);

  test("no console errors, page errors or failed requests, except the refused request's own 400", () => {
    const unexpected = problems.filter((p) => !(p.step === "refused" && /status of 400/.test(p.text)));
    expect(unexpected).toEqual([]);
  });
});

describe.skipIf(!haveChromium)("the playground when the model is not loaded", () => {
  const open = ownServerAndBrowser({ modelPath: join(testTempDir(), "no-such-model.safetensors") });

  test("says why in the header, and a message gets the server's 503 reason; no script errors", async () => {
    const { p, scriptErrors } = await open();
    const line = await p.$eval("#model-line", (n) => n.textContent ?? "");
    expect(line).toContain("not loaded");
    expect(line).toContain("no-such-model.safetensors");
    await p.$eval("#prompt", (n) => {
      (n as HTMLTextAreaElement).value = "Hello?";
    });
    await p.click("#send");
    await p.waitForFunction(() => [...document.querySelectorAll<HTMLElement>(".message.assistant")].at(-1)?.dataset.state === "error", {
      timeout: WAIT_MS,
    });
    const message = await p.$$eval(".message.assistant .error", (n) => n.at(-1)?.textContent ?? "");
    expect(message).toContain("model not loaded");
    expect(message).toContain("HTTP 503");
    expect(scriptErrors).toEqual([]);
  }, 120_000);
});

describe.skipIf(!haveChromium)("the playground on a server with an API key", () => {
  const KEY = "playground-test-key";
  const open = ownServerAndBrowser({ modelPath: TRAINED_MODEL_PATH, env: { SERVICE_MAX_SEQ_LEN: "512", SERVICE_API_KEY: KEY } });

  test("asks for the key after the server's 401, then chats with it; a wrong key is asked for again", async () => {
    const { p, scriptErrors } = await open();
    expect(await p.$eval("#key-form", (n) => (n as HTMLFormElement).hidden)).toBe(false);
    expect(await p.$eval("#model-line", (n) => n.textContent ?? "")).toContain("HTTP 401");

    const useKey = async (key: string) => {
      await p.$eval("#api-key", (n, k) => ((n as HTMLInputElement).value = k), key);
      await Promise.all([p.waitForNavigation({ waitUntil: "load" }), p.click("#key-save")]);
      await p.waitForSelector("body[data-ready=true]", { timeout: WAIT_MS });
    };
    await useKey("not-the-key");
    expect(await p.$eval("#key-form", (n) => (n as HTMLFormElement).hidden)).toBe(false);

    await useKey(KEY);
    expect(await p.$eval("#key-form", (n) => (n as HTMLFormElement).hidden)).toBe(true);
    expect(await p.$eval("#model-line", (n) => n.textContent ?? "")).toContain("default loops 8");
    await p.$eval("#prompt", (n) => ((n as HTMLTextAreaElement).value = "Who made the heaven and the earth?"));
    // Greedy: a sampled reply may open with a newline, the chat's stop string, and be empty.
    await p.$eval("#k-temperature", (n) => ((n as HTMLInputElement).value = "0"));
    await p.click("#send");
    await p.waitForFunction(() => [...document.querySelectorAll<HTMLElement>(".message.assistant")].at(-1)?.dataset.state === "done", {
      timeout: WAIT_MS,
    });
    const reply = await p.$$eval(".message.assistant .text", (n) => n.at(-1)?.textContent ?? "");
    expect(reply.length).toBeGreaterThan(0);
    expect(scriptErrors).toEqual([]);
  }, 120_000);
});
