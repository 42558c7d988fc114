// A reply's reasoning apart from its answer (docs/openai-compat.md#reasoning),
// for models that think between <think> and </think> (the convention of
// vLLM's DeepSeek-R1 and Qwen 3 reasoning parsers):
// - a reply whose prompt ends inside an open <think> (a template that opens
//   the reasoning in its generation prompt) starts as reasoning;
// - otherwise a reply that starts with <think> (whitespace before it
//   dropped) is reasoning from there; one that starts otherwise is all answer;
// - reasoning runs to the first </think>; the rest is the answer, as it is
//   (a later <think> in it is text). A reply that ends before </think> is
//   all reasoning.
// Tags are matched on text, so a tag split across tokens is still one tag:
// text that may be the start of one is held back until it is known.

export const THINK_OPEN = "<think>";
export const THINK_CLOSE = "</think>";

/** Some text of a reply, sorted. */
export interface ReplyPart {
  reasoning: string;
  content: string;
}

/** Whether a reply to `prompt` starts inside reasoning: the prompt ends with <think> and whitespace. */
export function opensReasoning(prompt: string): boolean {
  const at = prompt.lastIndexOf(THINK_OPEN);
  return at >= 0 && prompt.slice(at + THINK_OPEN.length).trim() === "";
}

/** Length of the longest end of `text` that is a proper beginning of `tag`. */
function partialTag(text: string, tag: string): number {
  for (let k = Math.min(text.length, tag.length - 1); k > 0; k--) if (tag.startsWith(text.slice(text.length - k))) return k;
  return 0;
}

type State = "start" | "reasoning" | "answer";

export class ReasoningSplitter {
  private state: State;
  private held = "";
  private reasoned: boolean;

  constructor(startsInside: boolean) {
    this.state = startsInside ? "reasoning" : "start";
    this.reasoned = startsInside;
  }

  /** Whether the reply had reasoning (an empty <think></think> counts). */
  get hadReasoning(): boolean {
    return this.reasoned;
  }

  /** The next text of the reply, sorted; text that may still be a tag is held back. */
  push(text: string): ReplyPart {
    const out: ReplyPart = { reasoning: "", content: "" };
    let buf = this.held + text;
    this.held = "";
    for (;;) {
      if (this.state === "start") {
        const rest = buf.trimStart();
        if (rest.startsWith(THINK_OPEN)) {
          this.state = "reasoning";
          this.reasoned = true;
          buf = rest.slice(THINK_OPEN.length);
          continue;
        }
        if (THINK_OPEN.startsWith(rest)) {
          this.held = buf; // whitespace, or the beginning of <think>
          return out;
        }
        this.state = "answer";
        continue;
      }
      if (this.state === "reasoning") {
        const at = buf.indexOf(THINK_CLOSE);
        if (at >= 0) {
          out.reasoning += buf.slice(0, at);
          buf = buf.slice(at + THINK_CLOSE.length);
          this.state = "answer";
          continue;
        }
        const keep = partialTag(buf, THINK_CLOSE);
        out.reasoning += buf.slice(0, buf.length - keep);
        this.held = buf.slice(buf.length - keep);
        return out;
      }
      out.content += buf;
      return out;
    }
  }

  /** The end of the reply: held text was no tag after all. */
  finish(): ReplyPart {
    const rest = this.held;
    this.held = "";
    return this.state === "reasoning" ? { reasoning: rest, content: "" } : { reasoning: "", content: rest };
  }
}

/** A whole reply, sorted. */
export function splitReasoning(text: string, startsInside: boolean): ReplyPart & { hadReasoning: boolean } {
  const s = new ReasoningSplitter(startsInside);
  const a = s.push(text);
  const b = s.finish();
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content, hadReasoning: s.hadReasoning };
}
