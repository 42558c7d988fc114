// Generated token ids → text deltas, the one piece every endpoint family uses:
// UTF-8-safe detokenisation (a character is emitted only when whole) followed
// by whole-string stop matching (text that might start a stop string is held
// back until it is known not to). The deltas of push() and finish() together
// are exactly the response text.
import { IncrementalDetokenizer, type Tokenizer } from "../tokenizer/tokenizer.ts";
import { StopStringMatcher } from "./stop.ts";

export interface TextDelta {
  /** New text to emit for this token; often "" (partial character, held stop prefix). */
  text: string;
  /** A stop string matched: generation should end after this token. */
  stopped: boolean;
}

export class TextStream {
  private readonly detokenizer: IncrementalDetokenizer;
  private readonly matcher: StopStringMatcher;
  private emitted = "";

  constructor(tokenizer: Tokenizer, stopStrings: readonly string[] = []) {
    this.detokenizer = new IncrementalDetokenizer(tokenizer);
    this.matcher = new StopStringMatcher(stopStrings);
  }

  /** True once a stop string has matched. */
  get stopped(): boolean {
    return this.matcher.stopped;
  }

  /** All text emitted so far. */
  get text(): string {
    return this.emitted;
  }

  push(tokenId: number): TextDelta {
    if (this.matcher.stopped) return { text: "", stopped: true };
    return this.take(this.matcher.push(this.detokenizer.push(tokenId)));
  }

  /**
   * End of generation: the detokenizer's tail (U+FFFD for bytes that never
   * formed a character) and any held text that turned out not to be a stop.
   */
  finish(): string {
    if (this.matcher.stopped) return "";
    const scan = this.matcher.push(this.detokenizer.flush());
    return this.take({ text: scan.text + this.matcher.flush(), stopped: scan.stopped }).text;
  }

  private take(delta: TextDelta): TextDelta {
    this.emitted += delta.text;
    return delta;
  }
}
