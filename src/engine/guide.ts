// Structured output in the engine: one generation's matcher (a
// TokenConstraint from its OutputFormat) and the token mask of its next
// draw, handed to the kernels with every masked row (binding.ts RowMask) or
// asked per path by a speculative cycle (PathMask). The kernels apply the
// mask to the logits before any draw, so every path samples only allowed
// tokens (docs/structured-output.md).
//
// The matcher advances by the generated tokens in order. A pipelined step's
// predicted row (batcher.ts) needs the mask after the token the step before
// drew before the engine has handed that token on, so a row's mask advances
// the matcher itself when it is filled, and the engine's own advance past
// the same token is then a no-op.
import { maskWords, type PathMask, type RowMask } from "./binding.ts";
import type { TokenConstraint } from "./types.ts";

/** Where the format stands after the tokens accepted so far. */
type Standing = "open" | "complete" | "ended";

export class Guide {
  /** Generated tokens the matcher has accepted. */
  private accepted = 0;
  /** The mask of the next token (after `accepted` tokens). */
  private readonly mask: Uint32Array;
  private standing: Standing;
  private readonly endIds: readonly number[];

  constructor(
    private readonly constraint: TokenConstraint,
    vocab: number,
    /** The model's end ids: a mask allowing nothing else means the value is complete. */
    endIds: readonly number[],
  ) {
    this.mask = new Uint32Array(maskWords(vocab));
    this.endIds = endIds.filter((id) => id >= 0 && id < vocab);
    this.standing = this.refresh();
  }

  /** True once the format's value is complete (only an end id may follow) or nothing may follow: generation ends there ("stop"). */
  get finished(): boolean {
    return this.standing !== "open";
  }

  /** The n-th generated token (1-based) is `token`: advances past it unless that is done. */
  advance(n: number, token: number): void {
    if (n === this.accepted) return;
    if (n !== this.accepted + 1) throw new Error(`internal: the format is at token ${this.accepted}, asked to advance to ${n}`);
    if (!this.constraint.accept(token)) throw new Error(`internal: the format refused token ${token}, which its mask allowed`);
    this.accepted = n;
    this.standing = this.refresh();
  }

  /** The mask of the draw after the first n generated tokens, for a batch row. */
  rowMask(n: number): RowMask {
    return {
      fill: (out) => this.fillAfter(n, out),
      successor: (token) => this.successorMask(n + 1, token),
    };
  }

  private successorMask(n: number, token: number): RowMask {
    return {
      fill: (out) => {
        this.advance(n, token);
        this.fillAfter(n, out);
      },
      successor: (next) => this.successorMask(n + 1, next),
    };
  }

  /**
   * The mask after the accepted tokens and then `path` (a speculative
   * cycle's drafts); false when no token may follow or the value is
   * complete there, which ends the cycle's verification at that path.
   */
  readonly pathMask: PathMask = (path, out) => {
    let taken = 0;
    while (taken < path.length && this.constraint.accept(path[taken])) taken++;
    const open = taken === path.length && this.constraint.fillMask(out) && this.allowsText(out);
    if (taken > 0) this.constraint.rollback(taken);
    return open;
  };

  /** Masks `logits` in place as the kernels would with the next token's mask (a draw made outside them: a scored prompt's first token). */
  maskLogits(logits: Float32Array): void {
    for (let id = 0; id < logits.length; id++) if (!((this.mask[id >>> 5] >>> (id & 31)) & 1)) logits[id] = Number.NEGATIVE_INFINITY;
  }

  dispose(): void {
    this.constraint.dispose();
  }

  private fillAfter(n: number, out: Uint32Array): void {
    if (n !== this.accepted) throw new Error(`internal: a row asked for the mask after ${n} tokens, the format is at ${this.accepted}`);
    // Nothing may follow: the row's token is never used (generation has
    // ended), but its draw needs some token to allow.
    if (this.standing === "ended") out.fill(0xffffffff);
    else out.set(this.mask);
  }

  private refresh(): Standing {
    if (!this.constraint.fillMask(this.mask)) return "ended";
    return this.allowsText(this.mask) ? "open" : "complete";
  }

  /** The mask allows some token that is not an end id. */
  private allowsText(mask: Uint32Array): boolean {
    const ends = this.endIds;
    for (let w = 0; w < mask.length; w++) {
      let bits = mask[w];
      if (bits === 0) continue;
      for (const id of ends) if (id >>> 5 === w) bits &= ~(1 << (id & 31));
      if (bits !== 0) return true;
    }
    return false;
  }
}
