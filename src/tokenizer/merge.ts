// The merge step of byte-pair encoding, shared by GPT-2's encoding and a
// model's own: a piece's symbols are merged pair by pair, the pair of lowest
// rank first and the leftmost of equal ranks, until no adjacent pair has a
// rank. Searching the symbols for the best pair after every merge (what
// tiktoken does) costs the square of the piece's length: a run of 256 KiB
// without spaces took a minute. Here a priority queue holds every adjacent
// pair by (rank, position) over a linked list of symbols, so a piece of n
// symbols takes n log n: a queued pair whose symbols changed since is
// skipped when it comes up, and each merge queues the two pairs it makes.
// Positions keep their order as symbols merge (a merged symbol keeps its
// left symbol's position), so the queue's order is the search's.

/** How many merges between checkpoint calls (a cancelled encode stops there). */
const CHECKPOINT_MERGES = 1 << 14;
/** Queue entries are rank * POSITIONS + position: one number orders by rank, then position. */
const POSITIONS = 2 ** 24;

export class PieceTooLongError extends Error {}

/**
 * `symbols` merged: `rankOf(left, right)` is the rank of merging two
 * adjacent symbols (-1: they do not merge), `mergedOf(rank, left, right)` the
 * symbol the merge makes. `checkpoint` is called every so many merges; it
 * may throw to stop.
 */
export function mergeByRank(
  symbols: ArrayLike<number>,
  rankOf: (left: number, right: number) => number,
  mergedOf: (rank: number, left: number, right: number) => number,
  checkpoint?: () => void,
): number[] {
  const n = symbols.length;
  if (n >= POSITIONS) throw new PieceTooLongError(`a piece of ${n} bytes is too long to encode`);
  const sym = Int32Array.from(symbols);
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  const heap = new MinHeap();
  const queue = (i: number) => {
    const j = next[i];
    if (j < 0) return;
    const r = rankOf(sym[i], sym[j]);
    if (r >= 0) heap.push(r * POSITIONS + i);
  };
  for (let i = 0; i + 1 < n; i++) queue(i);
  let merges = 0;
  while (heap.size > 0) {
    const top = heap.pop();
    const rank = Math.floor(top / POSITIONS);
    const i = top - rank * POSITIONS;
    const j = next[i];
    if (sym[i] < 0 || j < 0 || rankOf(sym[i], sym[j]) !== rank) continue;
    if (++merges % CHECKPOINT_MERGES === 0) checkpoint?.();
    sym[i] = mergedOf(rank, sym[i], sym[j]);
    sym[j] = -1;
    const k = next[j];
    next[i] = k;
    if (k >= 0) prev[k] = i;
    if (prev[i] >= 0) queue(prev[i]);
    queue(i);
  }
  const out: number[] = [];
  for (let i = 0; i >= 0 && n > 0; i = next[i]) out.push(sym[i]);
  return out;
}

/** A binary min-heap of numbers. */
class MinHeap {
  private readonly items: number[] = [];

  get size(): number {
    return this.items.length;
  }

  push(v: number): void {
    const a = this.items;
    a.push(v);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p] <= v) break;
      a[i] = a[p];
      i = p;
    }
    a[i] = v;
  }

  pop(): number {
    const a = this.items;
    const top = a[0];
    const last = a.pop() as number;
    if (a.length > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= a.length) break;
        const c = l + 1 < a.length && a[l + 1] < a[l] ? l + 1 : l;
        if (a[c] >= last) break;
        a[i] = a[c];
        i = c;
      }
      a[i] = last;
    }
    return top;
  }
}
