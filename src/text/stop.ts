// Whole-string stop matching on decoded text (docs/http.md#text; not a
// match on each stop string's first token): generation stops at the first place
// any stop string occurs, the stop string and everything after it are never
// returned, and streamed text is held back only while it could still be the
// beginning of a stop string.

export interface StopScan {
  /** Text that is now safe to emit (never part of a stop string). */
  text: string;
  /** True once a stop string has matched; later pushes return "". */
  stopped: boolean;
}

export class StopStringMatcher {
  private readonly stops: readonly string[];
  private readonly longest: number;
  private held = "";
  private matched = false;

  constructor(stops: readonly string[]) {
    // An empty stop string would match before any text: it has no meaning.
    this.stops = stops.filter((s) => s.length > 0);
    this.longest = Math.max(0, ...this.stops.map((s) => s.length));
  }

  get stopped(): boolean {
    return this.matched;
  }

  push(delta: string): StopScan {
    if (this.matched) return { text: "", stopped: true };
    if (this.stops.length === 0) return { text: delta, stopped: false };
    const buf = this.held + delta;
    // Everything before `held` was already cleared, so any match ends inside
    // `delta`; the earliest start wins when stop strings overlap.
    let at = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    }
    if (at >= 0) {
      this.matched = true;
      this.held = "";
      return { text: buf.slice(0, at), stopped: true };
    }
    const keep = this.pendingPrefixLength(buf);
    this.held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** End of generation without a match: the held text was not a stop after all. */
  flush(): string {
    const rest = this.matched ? "" : this.held;
    this.held = "";
    return rest;
  }

  // Length of the longest suffix of buf that is a proper prefix of a stop string.
  private pendingPrefixLength(buf: string): number {
    for (let k = Math.min(buf.length, this.longest - 1); k > 0; k--) {
      const tail = buf.slice(buf.length - k);
      if (this.stops.some((s) => s.startsWith(tail))) return k;
    }
    return 0;
  }
}
