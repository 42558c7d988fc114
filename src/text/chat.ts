// How a model's chat messages become one prompt, and where its reply ends
// (docs/openai-compat.md#chat-templates), worked out once per tokenizer:
// - A model that carries a chat template (metadata chat_template): the
//   template, run (jinja_template.ts). The prompt is tokenized as
//   `apply_chat_template` tokenizes it: the tokenizer's added tokens in the
//   text (<|im_start|>) are their ids, and nothing is put before it (a
//   template that wants bos_token writes it).
// - A model without one, in its chat format (metadata chat_format):
//   "chatml", `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//   `<|im_start|>assistant\n`; or "plain" (GPT-2's: no chat tokens), one line
//   per message, `System: …`, `User: …`, `Assistant: …`, then `Assistant:`.
//   The model's beginning id goes first, as for any text prompt.
// The end of an assistant turn is read from the renderer itself, never from
// a list of known tokens: a conversation whose last message is the
// assistant's is rendered without the generation prompt, and the first token
// after that message's text, whitespace aside, is the turn's end when it is
// one of the tokenizer's added tokens (<|im_end|> for ChatML, <|eot_id|>
// for Llama 3, <end_of_turn> for Gemma, the eos_token for templates that
// close a turn with it). A chat reply stops there as at the end-of-sequence ids.
// A model reasons (reasoning.ts) when its template or its added tokens
// name <think> or </think>.
import type { ChatFormat, Tokenizer } from "../tokenizer/tokenizer.ts";
import { ChatTemplate, ChatTemplateError, type ChatTurn } from "./jinja_template.ts";
import { THINK_CLOSE, THINK_OPEN } from "./reasoning.ts";

export { ChatTemplateError, type ChatTurn };

/** A model's chat conventions. */
export interface ModelChat {
  /** The prompt for a conversation, ending with the opening of the assistant's reply; ChatTemplateError when the model's template fails. */
  render(turns: readonly ChatTurn[]): string;
  /** Whether the model's beginning-of-sequence id goes before the prompt's ids (not under a template: it writes its own). */
  addsBos: boolean;
  /** Ids that end a reply beside the end-of-sequence ids: the end of an assistant turn. */
  turnEndIds: readonly number[];
  /** Whether replies may hold reasoning between <think> and </think>. */
  reasons: boolean;
}

/** A conversation rendered without or with the opening of the assistant's reply. */
type Renderer = (turns: readonly ChatTurn[], addGenerationPrompt: boolean) => string;

const LABEL: Record<string, string> = { system: "System", user: "User", assistant: "Assistant" };

const FORMATS: Record<ChatFormat, Renderer> = {
  chatml: (turns, open) => turns.map((t) => `<|im_start|>${t.role}\n${t.content}<|im_end|>\n`).join("") + (open ? "<|im_start|>assistant\n" : ""),
  plain: (turns, open) => [...turns.map((t) => `${LABEL[t.role] ?? t.role}: ${t.content}`), ...(open ? [`${LABEL.assistant}:`] : [])].join("\n"),
};

/** The assistant text the end of a turn is looked for after; no template changes it. */
const PROBE_REPLY = "loopserve";
const PROBE: readonly ChatTurn[] = [
  { role: "user", content: "Hello" },
  { role: "assistant", content: PROBE_REPLY },
];

/** The added token that follows an assistant message in `render`'s text, whitespace aside; none when another token does or the render fails. */
function turnEnd(render: Renderer, tokenizer: Tokenizer): number[] {
  let text: string;
  try {
    text = render(PROBE, false);
  } catch (e) {
    if (e instanceof ChatTemplateError) return [];
    throw e;
  }
  const at = text.lastIndexOf(PROBE_REPLY);
  if (at < 0) return [];
  for (const id of tokenizer.encode(text.slice(at + PROBE_REPLY.length))) {
    const piece = tokenizer.decode([id]);
    if (piece.trim() === "") continue;
    return tokenizer.addedTokenId(piece) === id ? [id] : [];
  }
  return [];
}

/** A template that failed to compile fails every render with its error. */
function templateRenderer(source: string, tokenizer: Tokenizer): Renderer {
  let template: ChatTemplate;
  try {
    template = ChatTemplate.compile(source, tokenizer.conventions.specialTokens);
  } catch (e) {
    if (!(e instanceof ChatTemplateError)) throw e;
    return () => {
      throw e;
    };
  }
  return (turns, open) => template.render(turns, open);
}

function buildChat(tokenizer: Tokenizer): ModelChat {
  const { chatTemplate, chatFormat } = tokenizer.conventions;
  const render = chatTemplate === null ? FORMATS[chatFormat] : templateRenderer(chatTemplate, tokenizer);
  const marks = (tag: string) => (chatTemplate?.includes(tag) ?? false) || tokenizer.addedTokenId(tag) !== undefined;
  return {
    render: (turns) => render(turns, true),
    addsBos: chatTemplate === null,
    turnEndIds: turnEnd(render, tokenizer),
    reasons: marks(THINK_OPEN) || marks(THINK_CLOSE),
  };
}

const chats = new WeakMap<Tokenizer, ModelChat>();

/** The chat conventions of the model `tokenizer` belongs to (built on first use). */
export function modelChat(tokenizer: Tokenizer): ModelChat {
  let chat = chats.get(tokenizer);
  if (chat === undefined) {
    chat = buildChat(tokenizer);
    chats.set(tokenizer, chat);
  }
  return chat;
}
