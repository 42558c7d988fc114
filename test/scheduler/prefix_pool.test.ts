import { describe, expect, test } from "bun:test";
import { PrefixPool } from "../../src/scheduler/prefix_pool.ts";
import { FakeSnapshot } from "./fake_engine.ts";

class Hits {
  n = 0;
  inc() {
    this.n++;
  }
}
const snap = (tokens: number[]) => new FakeSnapshot(tokens);

describe("PrefixPool", () => {
  test("lookup returns the entry with the longest common prefix, capped at prompt length - 1", () => {
    const hits = new Hits();
    const pool = new PrefixPool<FakeSnapshot>(8, hits);
    const sys = [10, 11, 12, 13];
    const a = snap([...sys, 20, 21]);
    const b = snap([...sys, 30]);
    const c = snap([10, 99]);
    pool.insert([...sys, 20, 21], 8, "fp16", 0, a);
    pool.insert([...sys, 30], 8, "fp16", 0, b);
    pool.insert([10, 99], 8, "fp16", 0, c);

    // A chat sharing the system prompt reuses it: 4 shared tokens.
    const h1 = pool.lookup([...sys, 40, 41, 42], 8, "fp16", 0)!;
    expect(h1.length).toBe(4);
    expect([a, b]).toContain(h1.snapshot);
    h1.done();
    // Longest match wins.
    const h2 = pool.lookup([...sys, 20, 21, 22], 8, "fp16", 0)!;
    expect(h2.snapshot).toBe(a);
    expect(h2.length).toBe(6);
    h2.done();
    // Identical prompt: at least one token is left to run for logits.
    const h3 = pool.lookup([...sys, 20, 21], 8, "fp16", 0)!;
    expect(h3.snapshot).toBe(a);
    expect(h3.length).toBe(5);
    expect(h3.commonPrefix).toBe(6);
    h3.done();
    // No common prefix, or only the single token that must be run: no hit.
    expect(pool.lookup([7, 8, 9], 8, "fp16", 0)).toBeNull();
    expect(pool.lookup([10], 8, "fp16", 0)).toBeNull();
    expect(hits.n).toBe(3);
  });

  test("an entry is valid only with at least the requested loops, the same cache mode and the same window", () => {
    const pool = new PrefixPool<FakeSnapshot>(8);
    const s = snap([1, 2, 3, 4]);
    pool.insert([1, 2, 3, 4], 4, "fp16", 0, s);
    const prompt = [1, 2, 3, 4, 5];
    expect(pool.lookup(prompt, 4, "fp16", 0)?.length).toBe(4);
    expect(pool.lookup(prompt, 2, "fp16", 0)?.length).toBe(4); // more loops than needed is fine
    expect(pool.lookup(prompt, 5, "fp16", 0)).toBeNull();
    expect(pool.lookup(prompt, 4, "int8", 0)).toBeNull();
    expect(pool.lookup(prompt, 4, "fp16", 16)).toBeNull();
    expect(pool.peek(prompt, 4, "fp16", 0)).toBe(4);
    expect(pool.peek(prompt, 5, "fp16", 0)).toBe(0);
  });

  test("evicts the least recently used entry at capacity and releases its snapshot", () => {
    const pool = new PrefixPool<FakeSnapshot>(2);
    const a = snap([1, 1]);
    const b = snap([2, 2]);
    const c = snap([3, 3]);
    pool.insert([1, 1], 2, "fp16", 0, a);
    pool.insert([2, 2], 2, "fp16", 0, b);
    pool.lookup([1, 1, 5], 2, "fp16", 0)!.done(); // a becomes most recently used
    pool.insert([3, 3], 2, "fp16", 0, c); // evicts b
    expect(pool.size).toBe(2);
    expect(b.released).toBe(1);
    expect(a.released + c.released).toBe(0);
    expect(pool.list().map((e) => e.tokens)).toEqual([[1, 1], [3, 3]]);
    pool.clear();
    expect([a.released, b.released, c.released]).toEqual([1, 1, 1]);
  });

  test("an entry pinned by a running request is released only when unpinned", () => {
    const pool = new PrefixPool<FakeSnapshot>(1);
    const a = snap([1, 2]);
    pool.insert([1, 2], 2, "fp16", 0, a);
    const hit = pool.lookup([1, 2, 3], 2, "fp16", 0)!;
    pool.insert([5, 6], 2, "fp16", 0, snap([5, 6])); // evicts a while in use
    expect(a.released).toBe(0);
    hit.done();
    hit.done(); // idempotent
    expect(a.released).toBe(1);
  });

  test("a covered insert is released at once and a covering insert replaces what it covers", () => {
    const pool = new PrefixPool<FakeSnapshot>(4);
    const long = snap([1, 2, 3, 4]);
    pool.insert([1, 2, 3, 4], 8, "fp16", 0, long);
    const short = snap([1, 2]);
    expect(pool.wants([1, 2], 8, "fp16", 0)).toBe(false);
    expect(pool.insert([1, 2], 8, "fp16", 0, short)).toBe(false);
    expect(short.released).toBe(1);
    expect(pool.wants([1, 2], 16, "fp16", 0)).toBe(true); // more loops than pooled: worth keeping
    const longer = snap([1, 2, 3, 4, 5]);
    expect(pool.insert([1, 2, 3, 4, 5], 8, "fp16", 0, longer)).toBe(true);
    expect(long.released).toBe(1);
    expect(pool.size).toBe(1);
  });

  test("capacity 0 disables the pool", () => {
    const hits = new Hits();
    const pool = new PrefixPool<FakeSnapshot>(0, hits);
    const s = snap([1, 2, 3]);
    expect(pool.insert([1, 2, 3], 2, "fp16", 0, s)).toBe(false);
    expect(s.released).toBe(1);
    expect(pool.lookup([1, 2, 3, 4], 2, "fp16", 0)).toBeNull();
    expect(pool.wants([1, 2, 3], 2, "fp16", 0)).toBe(false);
    expect(hits.n).toBe(0);
  });
});
