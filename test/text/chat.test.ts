// A model's chat conventions (src/text/chat.ts): its own template run as
// transformers runs it, the end of an assistant turn read from the renderer,
// and whether it reasons.
import { afterAll, describe, expect, test } from "bun:test";
import { ChatTemplateError, modelChat } from "../../src/text/chat.ts";
import { GPT2_CONVENTIONS, type SpecialTokens, type TextConventions, Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import { fixtureJson } from "../helpers/tokenizer_json.ts";

const opened: Tokenizer[] = [];
afterAll(() => {
  for (const t of opened) t.close();
});

/** The smol_style tokenizer (<|endoftext|>, <|im_start|>, <|im_end|> at 0..2) with more added tokens from id 2000. */
async function tokenizer(conventions: Partial<TextConventions>, added: string[] = []): Promise<Tokenizer> {
  const json = JSON.parse(fixtureJson("smol_style"));
  added.forEach((content, i) => json.added_tokens.push({ id: 2000 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  const t = await Tokenizer.fromSpec({ kind: "bpe", json: JSON.stringify(json) }, { ...GPT2_CONVENTIONS, eosIds: [0], ...conventions });
  opened.push(t);
  return t;
}

const withTemplate = (chatTemplate: string, specialTokens: SpecialTokens = {}, added: string[] = []) => tokenizer({ chatTemplate, specialTokens }, added);

const CHATML =
  "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const LLAMA3 =
  "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
const EOS_CLOSED = "{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' + m.content + ' [/INST]' }}{% else %}{{ ' ' + m.content + ' ' + eos_token }}{% endif %}{% endfor %}";

describe("the end of an assistant turn, read from the renderer", () => {
  test("ChatML's <|im_end|>, Llama 3's <|eot_id|>, the eos_token of a template that closes turns with it", async () => {
    expect(modelChat(await withTemplate(CHATML)).turnEndIds).toEqual([2]);
    expect(modelChat(await withTemplate(LLAMA3, { bos_token: "<|begin_of_text|>" }, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])).turnEndIds).toEqual([2003]);
    expect(modelChat(await withTemplate(EOS_CLOSED, { eos_token: "</s>" }, ["</s>"])).turnEndIds).toEqual([2000]);
  });

  test("none where text or nothing follows the reply, or where the template cannot render it", async () => {
    expect(modelChat(await withTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")).turnEndIds).toEqual([]);
    expect(modelChat(await withTemplate("{{ messages[0].content }}")).turnEndIds).toEqual([]);
    const userLast = "{% if messages[-1].role != 'user' %}{{ raise_exception('the last message must be the user') }}{% endif %}" + CHATML;
    const chat = modelChat(await withTemplate(userLast));
    expect(chat.turnEndIds).toEqual([]);
    expect(chat.render([{ role: "user", content: "Hi" }])).toBe("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  });

  test("the built-in formats of a model without a template: chatml ends at <|im_end|>, plain at none", async () => {
    expect(modelChat(await tokenizer({ chatFormat: "chatml" })).turnEndIds).toEqual([2]);
    expect(modelChat(await tokenizer({ chatFormat: "plain" })).turnEndIds).toEqual([]);
  });
});

describe("rendering", () => {
  test("the template gets the special tokens by name, add_generation_prompt, and tools as none; no beginning id is added to its prompt", async () => {
    const source = "{{ bos_token }}{{ tools is none }}|{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{% if add_generation_prompt %}>{% endif %}";
    const chat = modelChat(await withTemplate(source, { bos_token: "<|endoftext|>" }));
    expect(chat.render([{ role: "system", content: "S" }, { role: "user", content: "U" }])).toBe("<|endoftext|>true|system=S;user=U;>");
    expect(chat.addsBos).toBe(false);
    expect(modelChat(await tokenizer({ chatFormat: "plain" })).addsBos).toBe(true);
  });

  test("the built-in formats render as before", async () => {
    const turns = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
    ];
    expect(modelChat(await tokenizer({ chatFormat: "plain" })).render(turns)).toBe("System: Be brief.\nUser: Hi\nAssistant:");
    expect(modelChat(await tokenizer({ chatFormat: "chatml" })).render(turns)).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  test("a template that does not parse fails every render with its error", async () => {
    const chat = modelChat(await withTemplate("{% for m in messages %}"));
    expect(() => chat.render([{ role: "user", content: "Hi" }])).toThrow(ChatTemplateError);
    expect(() => chat.render([{ role: "user", content: "Hi" }])).toThrow(/does not parse/);
    expect(chat.turnEndIds).toEqual([]);
  });
});

describe("a model that reasons", () => {
  test("is one whose template or added tokens name <think> or </think>", async () => {
    expect(modelChat(await withTemplate(`${CHATML}{% if add_generation_prompt %}<think>\n{% endif %}`)).reasons).toBe(true);
    expect(modelChat(await withTemplate("{{ messages[-1].content.split('</think>')[-1] }}")).reasons).toBe(true);
    expect(modelChat(await tokenizer({ chatFormat: "chatml" }, ["<think>", "</think>"])).reasons).toBe(true);
    expect(modelChat(await withTemplate(CHATML)).reasons).toBe(false);
    expect(modelChat(await tokenizer({ chatFormat: "plain" })).reasons).toBe(false);
  });
});
