// How few tokens a text can possibly encode to, known long before its
// byte-pair encoding is done. BPE cost grows with the square of a run
// without spaces (256 KB of emoji: over half a minute), while a text can
// only ever be split into whole vocabulary tokens: the fewest tokens that
// cover its bytes is a lower bound on what BPE gives, and it is found in
// one pass over the bytes (a walk of a trie of the token bytes from each
// position). The walk goes WALK_DEPTH bytes deep at most: a token that
// would go on past that is taken to end wherever a token could (up to the
// longest token's length), the fewest tokens from any of those ends found
// by a sliding-window minimum. That only ever lowers the count, so it stays
// a lower bound, and the pass costs WALK_DEPTH steps a byte even where
// every position starts a 128-byte token (a run of GPT-2's longest token).
// A prompt whose bound is over the context is refused without running BPE
// at all; one within it is encoded piece by piece and stopped as soon as
// the ids so far plus the bound of the rest pass the limit
// (src/tokenizer/tokenizer.ts).

/** The deepest the walk from one position goes into the trie. */
const WALK_DEPTH = 16;

/** The token byte strings of a vocabulary as a trie, its edges in flat arrays. */
export class TokenCountBound {
  private constructor(
    /** Edges of node n: [edgeStart[n], edgeStart[n + 1]), sorted by byte. */
    private readonly edgeStart: Int32Array,
    private readonly edgeByte: Uint8Array,
    private readonly edgeTarget: Int32Array,
    /** 1 where the path from the root to the node spells a token. */
    private readonly isToken: Uint8Array,
    /** The longest token's length in bytes. */
    private readonly longest: number,
  ) {}

  static build(tokens: Iterable<Uint8Array>): TokenCountBound {
    const children: Map<number, number>[] = [new Map()];
    const terminal: number[] = [0];
    let longest = 0;
    for (const bytes of tokens) {
      if (bytes.length === 0) continue;
      longest = Math.max(longest, bytes.length);
      let node = 0;
      for (const b of bytes) {
        let next = children[node].get(b);
        if (next === undefined) {
          next = children.length;
          children[node].set(b, next);
          children.push(new Map());
          terminal.push(0);
        }
        node = next;
      }
      terminal[node] = 1;
    }
    const edgeStart = new Int32Array(children.length + 1);
    let edges = 0;
    children.forEach((c, n) => {
      edgeStart[n] = edges;
      edges += c.size;
    });
    edgeStart[children.length] = edges;
    const edgeByte = new Uint8Array(edges);
    const edgeTarget = new Int32Array(edges);
    children.forEach((c, n) => {
      let at = edgeStart[n];
      for (const [b, target] of [...c].sort((x, y) => x[0] - y[0])) {
        edgeByte[at] = b;
        edgeTarget[at++] = target;
      }
    });
    return new TokenCountBound(edgeStart, edgeByte, edgeTarget, Uint8Array.from(terminal), longest);
  }

  private child(node: number, byte: number): number {
    let lo = this.edgeStart[node];
    let hi = this.edgeStart[node + 1] - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const b = this.edgeByte[mid];
      if (b === byte) return this.edgeTarget[mid];
      if (b < byte) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  /**
   * For every byte offset i (0..length), the fewest tokens that can cover
   * bytes[i..]: a lower bound on the token count of any text that is a
   * sequence of whole pieces from i to the end. A byte no token holds counts
   * as none (the bound stays a bound).
   */
  suffixMinima(bytes: Uint8Array): Int32Array {
    const minima = this.minima(bytes);
    minima.fillTo(0);
    return minima.fewest;
  }

  /** suffixMinima's array, to be filled right to left a slice at a time (fillTo). */
  minima(bytes: Uint8Array): SuffixMinima {
    return new SuffixMinima(bytes, (node, byte) => this.child(node, byte), this.isToken, this.edgeStart, this.longest);
  }
}

/** The suffix minima of one text, filled from its end towards its start. */
export class SuffixMinima {
  readonly fewest: Int32Array;
  /** fewest[i] is known for every i at or after this. */
  private known: number;
  /** The ends (i + WALK_DEPTH, i + longest] of long tokens from i, by increasing fewest: a deque in window[lo, hi). */
  private readonly window: Int32Array;
  private lo: number;
  private hi: number;

  constructor(
    private readonly bytes: Uint8Array,
    private readonly child: (node: number, byte: number) => number,
    private readonly isToken: Uint8Array,
    private readonly edgeStart: Int32Array,
    private readonly longest: number,
  ) {
    this.fewest = new Int32Array(bytes.length + 1);
    this.known = bytes.length;
    this.window = new Int32Array(bytes.length + 2);
    this.lo = this.hi = bytes.length + 1;
  }

  /** Fills fewest[from..] (entries already known are kept). */
  fillTo(from: number): void {
    const { bytes, fewest, isToken, edgeStart, longest, window } = this;
    const n = bytes.length;
    for (let i = this.known - 1; i >= from; i--) {
      // The window of ends of tokens longer than the walk goes, for position i.
      const enter = i + WALK_DEPTH + 1;
      if (enter <= n) {
        while (this.lo < this.hi && fewest[window[this.lo]] >= fewest[enter]) this.lo++;
        window[--this.lo] = enter;
      }
      while (this.lo < this.hi && window[this.hi - 1] > i + longest) this.hi--;
      let best = fewest[i + 1];
      let covered = false;
      let node = 0;
      const stop = Math.min(n, i + WALK_DEPTH);
      let j = i;
      for (; j < stop; j++) {
        node = this.child(node, bytes[j]);
        if (node < 0) break;
        if (isToken[node] === 1) {
          const count = fewest[j + 1] + 1;
          if (!covered || count < best) best = count;
          covered = true;
        }
      }
      if (j === i + WALK_DEPTH && node >= 0 && edgeStart[node + 1] > edgeStart[node] && this.lo < this.hi) {
        const count = fewest[window[this.hi - 1]] + 1;
        if (!covered || count < best) best = count;
        covered = true;
      }
      fewest[i] = best;
    }
    this.known = Math.min(this.known, from);
  }
}
