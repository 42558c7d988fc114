// A model's own chat template (the Jinja text of its tokenizer_config.json
// `chat_template`), run as Hugging Face's `apply_chat_template` runs it, by
// @huggingface/jinja (the implementation Hugging Face's JavaScript libraries
// use; docs/openai-compat.md#chat-templates). The variables are the ones
// transformers passes: `messages`, `add_generation_prompt`, `tools` and
// `documents` as none (the server answers without tools), and the
// tokenizer's special tokens by name (`bos_token`, `eos_token`, ...); the
// library itself supplies `raise_exception`, `strftime_now`, `range` and
// transformers' block trimming (trim_blocks, lstrip_blocks).
import { Template } from "@huggingface/jinja";
import type { SpecialTokens } from "../tokenizer/tokenizer.ts";

/** A template that does not parse, or fails while rendering (raise_exception, a call on nothing). */
export class ChatTemplateError extends Error {}

/** One message as the template reads it. */
export interface ChatTurn {
  role: string;
  content: string;
}

/** The error's own words: the library throws plain Errors, and internal TypeErrors for some malformed input. */
function reason(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

export class ChatTemplate {
  private constructor(
    private readonly template: Template,
    private readonly specialTokens: SpecialTokens,
  ) {}

  /** The template compiled once; ChatTemplateError when it does not parse. */
  static compile(source: string, specialTokens: SpecialTokens = {}): ChatTemplate {
    try {
      return new ChatTemplate(new Template(source), specialTokens);
    } catch (e) {
      throw new ChatTemplateError(`does not parse: ${reason(e)}`);
    }
  }

  /** The conversation as the model reads it; with `addGenerationPrompt`, then the opening of the assistant's reply. */
  render(messages: readonly ChatTurn[], addGenerationPrompt = true): string {
    try {
      return this.template.render({
        ...this.specialTokens,
        messages: messages.map((m) => ({ role: m.role, content: m.content })),
        add_generation_prompt: addGenerationPrompt,
        tools: null,
        documents: null,
      });
    } catch (e) {
      // A stack overflow from a template that recurses is a failure of the template too.
      throw new ChatTemplateError(`failed to render: ${reason(e)}`);
    }
  }
}
