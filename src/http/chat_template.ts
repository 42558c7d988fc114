// Chat messages → one prompt text (docs/http.md#requests). The model has no
// chat-tuned tokenizer or special tokens, so the template is plain text:
// one line per message, `System: …`, `User: …` or `Assistant: …`, then
// `Assistant:` on its own line to prompt the reply. For example
//
//   [{role: "system", content: "Be brief."}, {role: "user", content: "Hi"}]
//
// renders as "System: Be brief.\nUser: Hi\nAssistant:".
import { badRequest, unprocessable } from "./errors.ts";
import type { ChatMessage, ChatRole } from "./schemas.ts";

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

/** The prompt for a conversation: its messages, one line each, then `Assistant:`. */
export function renderChat(messages: readonly ChatMessage[]): string {
  const lines = messages.map((m, i) => `${LABEL[m.role]}: ${messageText(m.content, `messages[${i}].content`)}`);
  lines.push(`${LABEL.assistant}:`);
  return lines.join("\n");
}
