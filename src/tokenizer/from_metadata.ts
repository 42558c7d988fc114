// A model file's tokenizer, from its safetensors metadata (the loopserve
// format's tokenizer keys, docs/tokenizers.md):
//   tokenizer       "gpt2" (default: GPT-2's BPE, the chat template plain text)
//                   | "bpe": the model's own BPE (byte-level or
//                   SentencePiece-style), then
//   tokenizer_json  the Hugging Face tokenizer.json text (required)
//   chat_format     "chatml" | "plain" (default plain): chat prompts of a
//                   model without a template
//   chat_template   the model's Jinja chat template, run for chat prompts
//   special_tokens  JSON: the special tokens the template reads by name
//                   ({"bos_token": "<|endoftext|>", ...}; optional)
//   eos_token_ids   comma-separated ids that end generation, e.g. "0,2" (required)
//   bos_token_id    an id put before every text prompt (optional)
// Every id must be inside the model's vocabulary (metadata vocab_size): the
// model has no embedding for an id past it, so a tokenizer that can produce
// one is refused. Errors are ModelTokenizerErrors naming the file and the key.
import { type ChatFormat, type SpecialTokens, type TextConventions, Tokenizer, TokenizerError } from "./tokenizer.ts";

/** Tokenizer metadata a model file cannot be served with; the message names the file and the key. */
export class ModelTokenizerError extends Error {}

/** The keys only a model with its own tokenizer has. */
const BPE_KEYS = ["tokenizer_json", "chat_format", "chat_template", "special_tokens", "eos_token_ids", "bos_token_id"];
/** The special tokens a ChatML prompt is made of (src/http/chat_template.ts). */
export const CHATML_TOKENS = ["<|im_start|>", "<|im_end|>"];

const ID = /^(0|[1-9][0-9]{0,8})$/;

/** The special_tokens metadata, or null when it is not an object of texts and lists of texts. */
function parseSpecialTokens(text: string): SpecialTokens | null {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return null;
  const isText = (t: unknown) => typeof t === "string";
  const ok = Object.values(v).every((t) => isText(t) || (Array.isArray(t) && t.every(isText)));
  return ok ? (v as SpecialTokens) : null;
}

/**
 * The tokenizer the metadata of the model file `where` names, built and
 * checked against the model's vocabulary; `tokenizerHome` applies to GPT-2's
 * (TOKENIZER_HOME).
 */
export async function loadModelTokenizer(meta: Record<string, string>, where: string, tokenizerHome: string | null = null): Promise<Tokenizer> {
  const bad = (msg: string): never => {
    throw new ModelTokenizerError(`${where}: metadata: ${msg}`);
  };
  const kind = meta.tokenizer ?? "gpt2";
  if (kind === "gpt2") {
    const extra = BPE_KEYS.filter((k) => k in meta);
    if (extra.length > 0) bad(`${extra.join(", ")} only go with tokenizer "bpe", and tokenizer is "gpt2"`);
    return Tokenizer.load(tokenizerHome);
  }
  if (kind !== "bpe") bad(`tokenizer must be "gpt2" or "bpe", got "${kind}"`);
  if (meta.format_version !== "2") bad(`tokenizer "bpe" needs format_version "2", got "${meta.format_version}"`);
  const json = meta.tokenizer_json;
  if (json === undefined || json === "") bad(`tokenizer "bpe" needs tokenizer_json (the Hugging Face tokenizer.json text)`);

  const vocab = /^[1-9][0-9]*$/.test(meta.vocab_size ?? "") ? Number(meta.vocab_size) : bad(`vocab_size must be a positive integer, got "${meta.vocab_size}"`);
  const inVocab = (key: string, s: string): number => {
    const t = s.trim();
    if (!ID.test(t)) bad(`${key} must hold token ids (decimal integers), got "${s}"`);
    const id = Number(t);
    if (id >= vocab) bad(`${key}: id ${id} is outside the model's vocabulary [0, ${vocab})`);
    return id;
  };
  const eos = meta.eos_token_ids ?? bad(`tokenizer "bpe" needs eos_token_ids (the ids that end generation, e.g. "0,2")`);
  const eosIds = [...new Set(eos.split(",").map((s) => inVocab("eos_token_ids", s)))];
  const bosId = meta.bos_token_id === undefined ? null : inVocab("bos_token_id", meta.bos_token_id);
  const chatFormat = (meta.chat_format ?? "plain") as ChatFormat;
  if (chatFormat !== "plain" && chatFormat !== "chatml") bad(`chat_format must be "chatml" or "plain", got "${meta.chat_format}"`);

  const specialTokens = meta.special_tokens === undefined ? {} : (parseSpecialTokens(meta.special_tokens) ?? bad(`special_tokens must be a JSON object of token names to texts (or lists of texts)`));
  const conventions: TextConventions = { eosIds, bosId, chatFormat, chatTemplate: meta.chat_template ?? null, specialTokens };
  let tokenizer: Tokenizer;
  try {
    tokenizer = await Tokenizer.fromSpec({ kind: "bpe", json }, conventions);
  } catch (e) {
    if (e instanceof TokenizerError) bad(`tokenizer_json: ${e.message}`);
    throw e;
  }
  if (tokenizer.vocabSize > vocab)
    bad(
      `tokenizer_json has token ids up to ${tokenizer.vocabSize - 1}, outside the model's vocabulary [0, ${vocab}) ` +
        `(vocab_size must be at least ${tokenizer.vocabSize})`,
    );
  if (chatFormat === "chatml")
    for (const t of CHATML_TOKENS)
      if (tokenizer.addedTokenId(t) === undefined) bad(`chat_format "chatml" needs ${t} as an added token of tokenizer_json`);
  return tokenizer;
}
