// A model file's metadata selects its tokenizer (src/tokenizer/from_metadata.ts):
// GPT-2's by default, else its own tokenizer.json, checked against the
// model's vocabulary, with its end and beginning ids and chat format.
import { describe, expect, test } from "bun:test";
import { loadModelTokenizer, ModelTokenizerError } from "../../src/tokenizer/from_metadata.ts";
import { bpeMetadata } from "../helpers/tokenizer_json.ts";

const WHERE = "/models/m.safetensors";
const load = (meta: Record<string, string>) => loadModelTokenizer({ vocab_size: "2048", format_version: "1", ...meta }, WHERE);

async function refusal(meta: Record<string, string>): Promise<string> {
  const err = await load(meta).catch((e) => e);
  expect(err).toBeInstanceOf(ModelTokenizerError);
  expect(err.message).toStartWith(`${WHERE}: metadata: `);
  return err.message as string;
}

describe("the model file's tokenizer", () => {
  test("without tokenizer keys (or tokenizer gpt2) it is GPT-2's, plain chat, end-of-text 50256", async () => {
    for (const meta of [{}, { tokenizer: "gpt2" }] as Record<string, string>[]) {
      const t = await load(meta);
      expect(t.source).toBe("bundled");
      expect(t.conventions).toEqual({ eosIds: [50256], bosId: null, chatFormat: "plain", chatTemplate: null, specialTokens: {} });
      expect(t.encode("Hello world")).toEqual([15496, 995]);
    }
  });

  test("tokenizer bpe: the model's tokenizer.json, its eos ids, bos id, chat format, template and special tokens", async () => {
    const t = await load(bpeMetadata({ bos_token_id: "0" }));
    expect(t.source).toBe("model");
    expect(t.conventions).toEqual({ eosIds: [0, 2], bosId: 0, chatFormat: "chatml", chatTemplate: null, specialTokens: {} });
    const template = "{{ bos_token }}{{ messages[0].content }}";
    const special = { bos_token: "<|im_start|>", additional_special_tokens: ["<|im_end|>"] };
    const own = await load(bpeMetadata({ chat_template: template, special_tokens: JSON.stringify(special) }));
    expect(own.conventions).toMatchObject({ chatTemplate: template, specialTokens: special });
    expect(t.encode("<|im_start|>")).toEqual([1]);
    const { chat_format: _, ...withoutChat } = bpeMetadata();
    expect((await load(withoutChat)).conventions.chatFormat).toBe("plain");
  });

  test("refusals name the key and what was expected", async () => {
    expect(await refusal({ tokenizer: "sentencepiece" })).toContain(`tokenizer must be "gpt2" or "bpe", got "sentencepiece"`);
    expect(await refusal({ tokenizer: "gpt2", chat_format: "chatml" })).toContain(`chat_format only go with tokenizer "bpe"`);
    expect(await refusal(bpeMetadata({ format_version: "1" }))).toContain(`needs format_version "2"`);
    expect(await refusal(bpeMetadata({ tokenizer_json: "" }))).toContain("needs tokenizer_json");
    for (const special_tokens of ["[]", '{"bos_token": 1}', '{"additional_special_tokens": [1]}', "{"])
      expect(await refusal(bpeMetadata({ special_tokens }))).toContain("special_tokens must be a JSON object of token names to texts");
    const { eos_token_ids: __, ...withoutEos } = bpeMetadata();
    expect(await refusal(withoutEos)).toContain("needs eos_token_ids");
    expect(await refusal(bpeMetadata({ eos_token_ids: "0,x" }))).toContain(`eos_token_ids must hold token ids (decimal integers), got "x"`);
    expect(await refusal(bpeMetadata({ eos_token_ids: "0,2048" }))).toContain("eos_token_ids: id 2048 is outside the model's vocabulary [0, 2048)");
    expect(await refusal(bpeMetadata({ bos_token_id: "-1" }))).toContain("bos_token_id must hold token ids");
    expect(await refusal(bpeMetadata({ chat_format: "llama" }))).toContain(`chat_format must be "chatml" or "plain", got "llama"`);
  });

  test("a tokenizer with ids past the model's vocabulary is refused", async () => {
    const err = await loadModelTokenizer({ ...bpeMetadata(), vocab_size: "1000" }, WHERE).catch((e) => e);
    expect(err).toBeInstanceOf(ModelTokenizerError);
    expect(err.message).toContain("tokenizer_json has token ids up to 1999, outside the model's vocabulary [0, 1000) (vocab_size must be at least 2000)");
  });

  test("a refused tokenizer.json is a ModelTokenizerError naming the piece", async () => {
    const json = JSON.parse(bpeMetadata().tokenizer_json);
    json.normalizer = { type: "Lowercase" };
    expect(await refusal(bpeMetadata({ tokenizer_json: JSON.stringify(json) }))).toContain(`tokenizer_json: tokenizer.json normalizer: type "Lowercase" is not supported`);
  });

  test("chatml needs <|im_start|> and <|im_end|> as added tokens", async () => {
    const json = JSON.parse(bpeMetadata().tokenizer_json);
    json.added_tokens = json.added_tokens.filter((t: { content: string }) => t.content !== "<|im_end|>");
    expect(await refusal(bpeMetadata({ tokenizer_json: JSON.stringify(json) }))).toContain(`chat_format "chatml" needs <|im_end|> as an added token`);
  });
});
