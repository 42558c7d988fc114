// Priority queue of waiting requests: higher `priority` first, FIFO within a
// priority (ties broken by a monotonically increasing sequence number, so
// the order is total and stable). A binary heap that tracks each item's
// index, so a cancelled request leaves the queue in O(log n) instead of
// lingering as a tombstone.
export interface QueueItem {
  readonly priority: number;
}

interface Slot<T> {
  item: T;
  priority: number;
  seq: number;
  index: number; // position in the heap; -1 once removed
}

export class QueueFullError extends Error {}

export class RequestQueue<T extends QueueItem> {
  private heap: Slot<T>[] = [];
  private slots = new Map<T, Slot<T>>();
  private seq = 0;

  /** capacity: most waiting items (SERVICE_MAX_QUEUE_DEPTH). */
  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 0)
      throw new RangeError(`queue capacity must be a non-negative integer, got ${capacity}`);
  }

  get size(): number {
    return this.heap.length;
  }

  get full(): boolean {
    return this.heap.length >= this.capacity;
  }

  has(item: T): boolean {
    return this.slots.has(item);
  }

  /** Adds an item; throws QueueFullError at capacity (callers check `full` first). */
  push(item: T): void {
    if (this.full) throw new QueueFullError(`queue is full (${this.capacity} waiting)`);
    if (this.slots.has(item)) throw new Error("item is already queued");
    const slot: Slot<T> = { item, priority: item.priority, seq: this.seq++, index: this.heap.length };
    this.heap.push(slot);
    this.slots.set(item, slot);
    this.up(slot.index);
  }

  /** The next item to run, without removing it. */
  peek(): T | undefined {
    return this.heap[0]?.item;
  }

  /** Removes and returns the next item to run. */
  pop(): T | undefined {
    const top = this.heap[0];
    if (!top) return undefined;
    this.removeAt(0);
    return top.item;
  }

  /** Removes a specific item (a cancelled request); false when it is not queued. */
  remove(item: T): boolean {
    const slot = this.slots.get(item);
    if (!slot) return false;
    this.removeAt(slot.index);
    return true;
  }

  /** Removes and returns every item, in run order. */
  drain(): T[] {
    const out: T[] = [];
    for (let it = this.pop(); it !== undefined; it = this.pop()) out.push(it);
    return out;
  }

  /** Items in heap order (not run order): for sums over the waiting work. */
  *items(): IterableIterator<T> {
    for (const s of this.heap) yield s.item;
  }

  // ---- heap internals ----

  /** a runs before b */
  private before(a: Slot<T>, b: Slot<T>): boolean {
    return a.priority !== b.priority ? a.priority > b.priority : a.seq < b.seq;
  }

  private place(slot: Slot<T>, i: number): void {
    this.heap[i] = slot;
    slot.index = i;
  }

  private up(i: number): void {
    const slot = this.heap[i];
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = this.heap[p];
      if (!this.before(slot, parent)) break;
      this.place(parent, i);
      i = p;
    }
    this.place(slot, i);
  }

  private down(i: number): void {
    const n = this.heap.length;
    const slot = this.heap[i];
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && this.before(this.heap[r], this.heap[l]) ? r : l;
      if (!this.before(this.heap[c], slot)) break;
      this.place(this.heap[c], i);
      i = c;
    }
    this.place(slot, i);
  }

  private removeAt(i: number): void {
    const slot = this.heap[i];
    const last = this.heap.pop() as Slot<T>;
    this.slots.delete(slot.item);
    slot.index = -1;
    if (i < this.heap.length) {
      this.place(last, i);
      this.down(i);
      this.up(last.index);
    }
  }
}
