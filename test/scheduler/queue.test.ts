import { describe, expect, test } from "bun:test";
import { QueueFullError, RequestQueue } from "../../src/scheduler/queue.ts";

interface Item {
  priority: number;
  name: string;
}
const item = (name: string, priority: number): Item => ({ name, priority });

describe("RequestQueue", () => {
  test("pops higher priority first and FIFO within a priority", () => {
    const q = new RequestQueue<Item>(100);
    for (const [n, p] of [["a", 0], ["b", 5], ["c", 0], ["d", 5], ["e", -1], ["f", 0], ["g", 9]] as const) q.push(item(n, p));
    expect(q.drain().map((i) => i.name)).toEqual(["g", "b", "d", "a", "c", "f", "e"]);
    expect(q.size).toBe(0);
  });

  test("order equals a stable sort by descending priority, under random pushes, pops and removals", () => {
    let seed = 12345;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const q = new RequestQueue<Item>(10_000);
    const model: Item[] = []; // kept in arrival order
    for (let step = 0; step < 5000; step++) {
      const r = rand();
      if (r < 0.55) {
        const it = item(`i${step}`, Math.floor(rand() * 5));
        q.push(it);
        model.push(it);
      } else if (r < 0.8) {
        const best = model.reduce<Item | undefined>((b, x) => (b === undefined || x.priority > b.priority ? x : b), undefined);
        expect(q.pop()).toBe(best);
        if (best) model.splice(model.indexOf(best), 1);
      } else if (model.length > 0) {
        const victim = model[Math.floor(rand() * model.length)];
        expect(q.remove(victim)).toBe(true);
        expect(q.remove(victim)).toBe(false);
        model.splice(model.indexOf(victim), 1);
      }
      expect(q.size).toBe(model.length);
    }
    const expected = [...model].sort((a, b) => b.priority - a.priority); // Array.prototype.sort is stable
    expect(q.drain()).toEqual(expected);
  });

  test("refuses pushes beyond capacity", () => {
    const q = new RequestQueue<Item>(2);
    q.push(item("a", 0));
    q.push(item("b", 0));
    expect(q.full).toBe(true);
    expect(() => q.push(item("c", 0))).toThrow(QueueFullError);
    q.pop();
    expect(q.full).toBe(false);
  });
});
