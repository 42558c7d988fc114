// How few tokens a text can possibly encode to, known long before its
// byte-pair encoding is done. BPE cost grows with the square of a run
// without spaces (256 KB of emoji: over half a minute), while a text can
// only ever be split into whole vocabulary tokens: the fewest tokens that
// cover its bytes is a lower bound on what BPE gives, and it is found in
// one pass over the bytes (a walk of a trie of the token bytes from each
// position, a token is at most 128 bytes long). A prompt whose bound is over
// the context is refused without running BPE at all; one within it is
// encoded piece by piece and stopped as soon as the ids so far plus the
// bound of the rest pass the limit (src/tokenizer/tokenizer.ts).

/** The token byte strings of a vocabulary as a trie, its edges in flat arrays. */
export class TokenCountBound {
  private constructor(
    /** Edges of node n: [edgeStart[n], edgeStart[n + 1]), sorted by byte. */
    private readonly edgeStart: Int32Array,
    private readonly edgeByte: Uint8Array,
    private readonly edgeTarget: Int32Array,
    /** 1 where the path from the root to the node spells a token. */
    private readonly isToken: Uint8Array,
  ) {}

  static build(tokens: Iterable<Uint8Array>): TokenCountBound {
    const children: Map<number, number>[] = [new Map()];
    const terminal: number[] = [0];
    for (const bytes of tokens) {
      if (bytes.length === 0) continue;
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
    return new TokenCountBound(edgeStart, edgeByte, edgeTarget, Uint8Array.from(terminal));
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
    const fewest = new Int32Array(bytes.length + 1);
    this.fill(bytes, fewest, 0, bytes.length);
    return fewest;
  }

  /**
   * suffixMinima's entries [from, to), given those from `to` on: filled
   * right to left in slices, they make the whole array a slice at a time.
   */
  fill(bytes: Uint8Array, fewest: Int32Array, from: number, to: number): void {
    const n = bytes.length;
    for (let i = to - 1; i >= from; i--) {
      let best = fewest[i + 1];
      let covered = false;
      let node = 0;
      for (let j = i; j < n; j++) {
        node = this.child(node, bytes[j]);
        if (node < 0) break;
        if (this.isToken[node] === 1) {
          const count = fewest[j + 1] + 1;
          if (!covered || count < best) best = count;
          covered = true;
        }
      }
      fewest[i] = best;
    }
  }
}
