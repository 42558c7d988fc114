// Chat completions of a model that carries its own chat template and may
// reason (docs/openai-compat.md#chat-templates, #reasoning), through the real
// app around a stand-in engine that answers with scripted ids: the prompt is
// the template rendered, a chat reply ends at the template's end of turn, a
// failing template is a 400 naming its error, and <think> text comes back
// apart from the answer, whole and streamed. test/http/ouro_import.test.ts
// serves an imported checkpoint the same way with a real server.
import { describe, expect, test } from "bun:test";
import { loadConfig } from "../../src/config.ts";
import type { GenerateRequest } from "../../src/engine/types.ts";
import { GPT2_CONVENTIONS, type TextConventions, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { ChatCompletion, ChatCompletionChunk } from "../../src/wire/responses.ts";
import { jsonBody, sseEvents } from "../helpers/http.ts";
import { scriptedEngine } from "../helpers/scripted_engine.ts";
import { inProcessApp } from "../helpers/server.ts";
import { fixtureJson } from "../helpers/tokenizer_json.ts";

const IM_END = 2;
const SYSTEM = "<|im_start|>system\nYou are terse.<|im_end|>\n";
/** ChatML with a default system turn and the beginning token the model's special tokens name. */
const TEMPLATE =
  "{{ bos_token }}{% if messages[0].role != 'system' %}{{ " +
  JSON.stringify(SYSTEM) +
  " }}{% endif %}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
/** The same, opening the reasoning in the generation prompt. */
const THINKING_TEMPLATE = TEMPLATE.replace("<|im_start|>assistant\\n' }}", "<|im_start|>assistant\\n<think>\\n' }}");

const CONVENTIONS: TextConventions = { ...GPT2_CONVENTIONS, eosIds: [0], bosId: 0, chatTemplate: TEMPLATE, specialTokens: { bos_token: "<|endoftext|>" } };

/** An app whose model replies with `reply`'s ids, then <|im_end|>, then more text. */
async function app(reply: string, conventions: Partial<TextConventions> = {}, env: Record<string, string> = {}) {
  const tok = await Tokenizer.fromSpec({ kind: "bpe", json: fixtureJson("smol_style") }, { ...CONVENTIONS, ...conventions });
  const seen: GenerateRequest[] = [];
  const script = [...tok.encode(reply), IM_END, ...tok.encode(" after the turn")];
  return { tok, seen, ...(await inProcessApp(scriptedEngine(script, seen), loadConfig(env), tok)) };
}

const chat = (messages: { role: string; content: string }[], extra: Record<string, unknown> = {}) => ({ model: "m", messages, max_tokens: 64, ...extra });
const HI = [{ role: "user", content: "Hi" }];

/** A whole chat reply's message, its body checked against the response schema. */
async function message(res: Promise<Response>): Promise<ChatCompletion["choices"][number]["message"]> {
  return (await jsonBody(await res, ChatCompletion)).choices[0].message;
}

/** A stream's deltas (each chunk checked against the chunk schema), and their text joined by field. */
async function streamed(res: Promise<Response>) {
  const deltas = sseEvents(await (await res).text(), ChatCompletionChunk).map((c) => c.choices[0]?.delta ?? {});
  return { content: deltas.map((d) => d.content ?? "").join(""), reasoning: deltas.map((d) => d.reasoning_content ?? "").join(""), deltas };
}

describe("the model's chat template", () => {
  test("the prompt is the template rendered (its default system turn, its own beginning token, no second one), counted in usage", async () => {
    const { tok, seen, post } = await app("Hello.");
    const body = await (await post("/v1/chat/completions", chat(HI))).json();
    const rendered = `<|endoftext|>${SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n`;
    expect(seen[0].promptTokens).toEqual(tok.encode(rendered));
    expect(seen[0].promptTokens.slice(0, 2)).toEqual([0, 1]);
    expect(body.usage.prompt_tokens).toBe(tok.encode(rendered).length);
    // A text prompt still gets the beginning id put before it.
    await post("/v1/completions", { model: "m", prompt: "Hi", max_tokens: 4 });
    expect(seen[1].promptTokens).toEqual([0, ...tok.encode("Hi")]);
  });

  test("a chat reply ends at the template's end of turn; a text completion only at the end-of-sequence ids", async () => {
    const { seen, post } = await app("Hello.");
    const body = await (await post("/v1/chat/completions", chat(HI))).json();
    expect(body.choices[0]).toMatchObject({ message: { role: "assistant", content: "Hello." }, finish_reason: "stop" });
    expect(seen[0].stopTokenIds.sort()).toEqual([0, IM_END]);
    const text = await (await post("/v1/completions", { model: "m", prompt: "Hi", max_tokens: 64 })).json();
    expect(text.choices[0].text).toBe("Hello.<|im_end|> after the turn");
    expect(seen[1].stopTokenIds).toEqual([0]);
  });

  test("a template that fails to render is a 400 naming its error; text completions still run", async () => {
    for (const [template, words] of [
      ["{% if messages[0].role == 'user' %}{{ raise_exception('Conversations must start with a system message') }}{% endif %}", "failed to render: Conversations must start with a system message"],
      ["{% for m in messages %}{{ m.content }}", "does not parse"],
    ]) {
      const { post } = await app("Hello.", { chatTemplate: template });
      const res = await post("/v1/chat/completions", chat(HI));
      expect(res.status).toBe(400);
      const { error } = await res.json();
      expect(error).toMatchObject({ type: "invalid_request_error", param: "messages", code: "chat_template_error" });
      expect(error.message).toContain(`the model's chat template ${words}`);
      expect((await post("/v1/completions", { model: "m", prompt: "Hi", max_tokens: 4 })).status).toBe(200);
    }
  });

  test("a rendered prompt longer than the context is the usual context-length 400", async () => {
    const { post } = await app("Hello.", { chatTemplate: `{{ '${"word ".repeat(200)}' }}${TEMPLATE}` }, { SERVICE_MAX_SEQ_LEN: "128" });
    const res = await post("/v1/chat/completions", chat(HI, { max_tokens: 4 }));
    expect(res.status).toBe(400);
    expect((await res.json()).error).toMatchObject({ param: "messages", code: "context_length_exceeded" });
  });
});

describe("reasoning apart from the answer", () => {
  const REASONING = { chatTemplate: THINKING_TEMPLATE };

  test("a reply that thinks first: reasoning_content and content, whole and streamed; the tags split across tokens", async () => {
    const reply = "<think>\nTwo and one.\n</think>\n\nThree.";
    const { tok, post } = await app(reply, { chatTemplate: TEMPLATE.replace("{{ bos_token }}", "{# may <think> #}{{ bos_token }}") });
    expect(tok.encode("</think>").length).toBeGreaterThan(1);
    expect(await message(post("/v1/chat/completions", chat(HI)))).toEqual({ role: "assistant", content: "\n\nThree.", reasoning_content: "\nTwo and one.\n" });
    const s = await streamed(post("/v1/chat/completions", chat(HI, { stream: true })));
    expect({ content: s.content, reasoning: s.reasoning }).toEqual({ content: "\n\nThree.", reasoning: "\nTwo and one.\n" });
    for (const d of s.deltas) expect(`${d.content ?? ""}${d.reasoning_content ?? ""}`).not.toMatch(/<\/?think>/);
  });

  test("a template that opens the reasoning: the reply starts inside it; one that ends inside it is all reasoning", async () => {
    const closed = await app("Two and one.</think>Three.", REASONING);
    expect(await message(closed.post("/v1/chat/completions", chat(HI)))).toEqual({ role: "assistant", content: "Three.", reasoning_content: "Two and one." });
    const open = await app("Two and one, and then", REASONING);
    expect(await message(open.post("/v1/chat/completions", chat(HI)))).toEqual({ role: "assistant", content: "", reasoning_content: "Two and one, and then" });
    const s = await streamed(open.post("/v1/chat/completions", chat(HI, { stream: true })));
    expect({ content: s.content, reasoning: s.reasoning }).toEqual({ content: "", reasoning: "Two and one, and then" });
  });

  test("include_reasoning: false leaves the reasoning out; a reply without reasoning has reasoning_content null", async () => {
    const { post } = await app("Two and one.</think>Three.", REASONING);
    expect(await message(post("/v1/chat/completions", chat(HI, { include_reasoning: false })))).toEqual({ role: "assistant", content: "Three." });
    const s = await streamed(post("/v1/chat/completions", chat(HI, { stream: true, include_reasoning: false })));
    expect({ content: s.content, reasoning: s.reasoning }).toEqual({ content: "Three.", reasoning: "" });
    const plain = await app("Just the answer.", { chatTemplate: TEMPLATE.replace("{{ bos_token }}", "{# <think> #}{{ bos_token }}") });
    expect(await message(plain.post("/v1/chat/completions", chat(HI)))).toEqual({ role: "assistant", content: "Just the answer.", reasoning_content: null });
  });

  test("a model that does not reason returns its text as the answer, tags and all", async () => {
    const { post } = await app("<think>x</think>y");
    expect(await message(post("/v1/chat/completions", chat(HI)))).toEqual({ role: "assistant", content: "<think>x</think>y" });
  });
});
