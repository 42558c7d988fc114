// Chat messages → one prompt text (docs/http.md#requests), by the model's
// own chat template or its chat format (src/text/chat.ts). Here: the
// messages' content as text, and a template that fails as a 400 naming it.
import { ChatTemplateError, type ModelChat } from "../text/chat.ts";
import { badRequest, unprocessable } from "./errors.ts";
import type { ChatMessage } from "../wire/requests.ts";

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

/** The prompt for a conversation in the model's chat conventions: its messages, then the opening of the assistant's reply. */
export function renderChat(messages: readonly ChatMessage[], chat: ModelChat): string {
  const turns = messages.map((m, i) => ({ role: m.role, content: messageText(m.content, `messages[${i}].content`) }));
  try {
    return chat.render(turns);
  } catch (e) {
    if (e instanceof ChatTemplateError) throw badRequest(`the model's chat template ${e.message}`, "messages", "chat_template_error");
    throw e;
  }
}
