// Client-side timing of one streamed reply: the time to the first token and
// the tokens per second, both from when the request was sent, as the
// server's own tokens_per_second counts the prompt's prefill in. Measured
// over the whole reply rather than between arrivals, because a fast model's
// tokens reach the page in bursts.
import { stat } from "./dom.ts";

export class ReplyTiming {
  private readonly start: number;
  private first: number | null = null;
  private last: number | null = null;
  tokens = 0;

  constructor(private readonly now: () => number = () => performance.now()) {
    this.start = now();
  }

  /** Records `count` tokens arriving now. */
  arrived(count = 1): void {
    if (count <= 0) return;
    const t = this.now();
    this.first ??= t;
    this.last = t;
    this.tokens += count;
  }

  /** Milliseconds from the request to the first token; null before it. */
  get firstTokenMs(): number | null {
    return this.first === null ? null : this.first - this.start;
  }

  /** Tokens per second from the request to the latest token; null before one arrived. */
  get tokensPerSecond(): number | null {
    if (this.last === null || this.last <= this.start) return null;
    return (this.tokens * 1000) / (this.last - this.start);
  }
}

const formatMs = (ms: number | null): string => (ms === null ? "–" : ms < 10 ? `${ms.toFixed(1)} ms` : `${Math.round(ms)} ms`);
const formatRate = (r: number | null): string => (r === null ? "–" : r < 10 ? r.toFixed(1) : String(Math.round(r)));

/** The tokens, tok/s and TTFT figures of a reply's stats line; the server's tokens/s replaces the live one when known. */
export function timingStats(timing: ReplyTiming, tokens: number, serverRate?: number): HTMLSpanElement[] {
  const rate =
    serverRate === undefined
      ? stat("tokens_per_second", "tok/s", formatRate(timing.tokensPerSecond), "tokens over the time since the request was sent")
      : stat("tokens_per_second", "tok/s", formatRate(serverRate), "measured by the server: tokens over the request's time in the engine");
  return [
    stat("tokens", "tokens", String(tokens)),
    rate,
    stat("ttft", "TTFT", formatMs(timing.firstTokenMs), "time to first token, from sending the request"),
  ];
}
