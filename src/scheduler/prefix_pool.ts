// Shared prefix pool: key/value-cache snapshots of past prompts, so a new
// prompt that starts the same way (a repeated system prompt, a chat that
// grows turn by turn) skips prefilling the shared part.
//
// An entry is valid for a request when it was computed with at least as many
// loops (loops 0..L-1 of a token do not depend on later loops,
// docs/kernels.md), the same cache mode and the same cache window. Among valid
// entries the one sharing the longest common prefix with the prompt wins.
// The usable length is capped at prompt length - 1: the engine must still run
// at least one prompt token to get logits for the first sampled token.
//
// Least recently used entries are evicted at capacity; an evicted snapshot
// is released. Snapshots are opaque here (the engine makes them); an entry
// in use by the running request is pinned, and its release is deferred
// until it is unpinned, whatever the engine's copy semantics.

/** An engine-made cache snapshot; the pool owns it until it calls release(). */
export interface Snapshot {
  release(): void;
}

interface Entry<S extends Snapshot> {
  readonly tokens: readonly number[];
  readonly loops: number;
  readonly cacheMode: string;
  readonly cacheWindow: number;
  readonly snapshot: S;
  pins: number;
  evicted: boolean;
}

/** A lookup result; the entry stays pinned until done() is called. */
export interface PrefixHit<S extends Snapshot> {
  readonly snapshot: S;
  readonly length: number; // usable positions: restore the snapshot and keep positions [0, length)
  readonly commonPrefix: number; // tokens shared with the prompt before the length cap
  readonly entryTokens: number; // positions the snapshot holds
  readonly entryLoops: number; // loops the snapshot holds (>= the request's)
  done(): void;
}

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

export class PrefixPool<S extends Snapshot> {
  // Map iteration order is insertion order: first = least recently used.
  private entries = new Map<Entry<S>, true>();

  /** capacity: SERVICE_PREFIX_POOL_CAPACITY (0 disables the pool); hits: counts lookups that found a prefix. */
  constructor(
    readonly capacity: number,
    private readonly hits?: { inc(): void },
  ) {
    if (!Number.isInteger(capacity) || capacity < 0)
      throw new RangeError(`prefix pool capacity must be a non-negative integer, got ${capacity}`);
  }

  get size(): number {
    return this.entries.size;
  }

  get enabled(): boolean {
    return this.capacity > 0;
  }

  /** The pooled prefixes, least recently used first (for tests and diagnostics). */
  list(): { tokens: readonly number[]; loops: number; cacheMode: string; cacheWindow: number }[] {
    return [...this.entries.keys()].map(({ tokens, loops, cacheMode, cacheWindow }) => ({ tokens, loops, cacheMode, cacheWindow }));
  }

  private best(prompt: readonly number[], loops: number, cacheMode: string, cacheWindow: number) {
    let found: Entry<S> | undefined;
    let lcp = 0;
    for (const e of this.entries.keys()) {
      if (e.loops < loops || e.cacheMode !== cacheMode || e.cacheWindow !== cacheWindow) continue;
      const n = commonPrefix(e.tokens, prompt);
      if (n > 0 && n >= lcp) {
        // >=: on a tie the more recently used entry (later in the map) wins
        found = e;
        lcp = n;
      }
    }
    return { found, lcp, usable: Math.min(lcp, prompt.length - 1) };
  }

  /** Usable prefix length for a prompt, with no side effects (for latency prediction). */
  peek(prompt: readonly number[], loops: number, cacheMode: string, cacheWindow: number): number {
    return Math.max(0, this.best(prompt, loops, cacheMode, cacheWindow).usable);
  }

  /**
   * The valid entry sharing the longest common prefix with `prompt`, or null
   * when none shares a usable one. A hit is counted, the entry becomes most
   * recently used, and it stays pinned until hit.done().
   */
  lookup(prompt: readonly number[], loops: number, cacheMode: string, cacheWindow: number): PrefixHit<S> | null {
    const { found, lcp, usable } = this.best(prompt, loops, cacheMode, cacheWindow);
    if (!found || usable <= 0) return null;
    this.touch(found);
    this.hits?.inc();
    found.pins++;
    let open = true;
    return {
      snapshot: found.snapshot,
      length: usable,
      commonPrefix: lcp,
      entryTokens: found.tokens.length,
      entryLoops: found.loops,
      done: () => {
        if (!open) return;
        open = false;
        found.pins--;
        if (found.evicted && found.pins === 0) found.snapshot.release();
      },
    };
  }

  /**
   * Whether inserting these tokens would add anything: false when an entry
   * already covers them (the same tokens or a longer prompt starting with
   * them, at least as many loops, same mode and window). Lets the scheduler
   * skip asking the engine for a snapshot it would throw away.
   */
  wants(tokens: readonly number[], loops: number, cacheMode: string, cacheWindow: number): boolean {
    if (!this.enabled || tokens.length < 2) return false;
    return this.dominating(tokens, loops, cacheMode, cacheWindow) === undefined;
  }

  private dominating(tokens: readonly number[], loops: number, cacheMode: string, cacheWindow: number) {
    for (const e of this.entries.keys())
      if (
        e.loops >= loops &&
        e.cacheMode === cacheMode &&
        e.cacheWindow === cacheWindow &&
        e.tokens.length >= tokens.length &&
        commonPrefix(e.tokens, tokens) === tokens.length
      )
        return e;
    return undefined;
  }

  /**
   * Adds a snapshot of the key/value cache after running `tokens` at `loops`
   * loops. The pool takes ownership: the snapshot is released at once when it
   * adds nothing (pool disabled, or covered by an existing entry), else when
   * evicted. Entries the new one covers are evicted. Returns whether it was kept.
   */
  insert(tokens: readonly number[], loops: number, cacheMode: string, cacheWindow: number, snapshot: S): boolean {
    if (!this.enabled || tokens.length === 0) {
      snapshot.release();
      return false;
    }
    const cover = this.dominating(tokens, loops, cacheMode, cacheWindow);
    if (cover) {
      this.touch(cover);
      snapshot.release();
      return false;
    }
    for (const e of [...this.entries.keys()])
      if (
        e.loops <= loops &&
        e.cacheMode === cacheMode &&
        e.cacheWindow === cacheWindow &&
        e.tokens.length <= tokens.length &&
        commonPrefix(e.tokens, tokens) === e.tokens.length
      )
        this.evict(e);
    const entry: Entry<S> = { tokens: tokens.slice(), loops, cacheMode, cacheWindow, snapshot, pins: 0, evicted: false };
    this.entries.set(entry, true);
    while (this.entries.size > this.capacity) this.evict(this.entries.keys().next().value as Entry<S>);
    return true;
  }

  /** Evicts everything (shutdown); pinned snapshots are released when unpinned. */
  clear(): void {
    for (const e of [...this.entries.keys()]) this.evict(e);
  }

  private touch(e: Entry<S>): void {
    this.entries.delete(e);
    this.entries.set(e, true);
  }

  private evict(e: Entry<S>): void {
    if (!this.entries.delete(e)) return;
    e.evicted = true;
    if (e.pins === 0) e.snapshot.release();
  }
}
