// Chat messages → one prompt text (docs/http.md#requests), in the model's
// chat format (its metadata chat_format, docs/tokenizers.md):
// - "plain" (a model without chat special tokens, GPT-2's): one line per
//   message, `System: …`, `User: …` or `Assistant: …`, then `Assistant:` on
//   its own line to prompt the reply. For example
//
//     [{role: "system", content: "Be brief."}, {role: "user", content: "Hi"}]
//
//   renders as "System: Be brief.\nUser: Hi\nAssistant:".
// - "chatml": `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//   `<|im_start|>assistant\n` (transformers' add_generation_prompt). The
//   model's tokenizer matches <|im_start|> and <|im_end|> in the text as its
//   special ids.
import type { ChatFormat } from "../tokenizer/tokenizer.ts";
import { badRequest, unprocessable } from "./errors.ts";
import type { ChatMessage, ChatRole } from "../wire/requests.ts";

const LABEL: Record<ChatRole, string> = { system: "System", user: "User", assistant: "Assistant" };

/** Separator between the texts of several content parts, as vLLM joins them. */
const PART_SEPARATOR = "\n";

/**
 * The text of one message's content: a string as is, the texts of its
 * content parts joined, "" for null. Non-text parts (images, audio, files)
 * are refused with a 400 naming the part: the model only reads text.
 */
function messageText(content: ChatMessage["content"], param: string): string {
  if (content === null) return "";
  if (typeof content === "string") return content;
  return content
    .map((part, j) => {
      const where = `${param}[${j}]`;
      if (part.type !== "text")
        throw badRequest(
          `\`${where}.type\` is ${JSON.stringify(part.type)}: only "text" content parts are supported`,
          `${where}.type`,
          "unsupported_content",
        );
      if (part.text === undefined) throw unprocessable(`\`${where}.text\` is required`, `${where}.text`, "missing_required_parameter");
      return part.text;
    })
    .join(PART_SEPARATOR);
}

/** The prompt for a conversation in `format`: its messages, then the opening of the assistant's reply. */
export function renderChat(messages: readonly ChatMessage[], format: ChatFormat = "plain"): string {
  const texts = messages.map((m, i) => messageText(m.content, `messages[${i}].content`));
  if (format === "chatml") return `${messages.map((m, i) => `<|im_start|>${m.role}\n${texts[i]}<|im_end|>\n`).join("")}<|im_start|>assistant\n`;
  const lines = messages.map((m, i) => `${LABEL[m.role]}: ${texts[i]}`);
  lines.push(`${LABEL.assistant}:`);
  return lines.join("\n");
}
