// GPT-2's encoding done here rather than in tiktoken, for texts with long
// pieces: tiktoken finds each merge by scanning the whole piece, the square
// of its length (a 128 KiB run of letters took 7 s, 256 KiB a minute). The
// rule is tiktoken's: a piece that is a token is that token; otherwise its
// bytes are merged pair by pair, lowest rank of the merged bytes first,
// leftmost on ties (src/tokenizer/merge.ts, n log n). Pieces come from
// GPT-2's pattern run by src/tokenizer/linear_regex.ts, whose character
// classes are JavaScript's Unicode tables: the same pieces as tiktoken's
// (test/tokenizer/tokenizer.test.ts compares them), bar characters the two
// Unicode versions classify differently.
import { mergeByRank } from "./merge.ts";
import { byteLevelStage, pretokenize, type Stage } from "./pretokenize.ts";

/** Pair ranks remembered; emptied when it holds this many. */
const PAIR_CACHE_ENTRIES = 1 << 20;

export class RankBpe {
  /** Each rank's bytes as a Latin-1 string, the key of rankByBytes. */
  private readonly keys: string[] = [];
  private readonly rankByBytes = new Map<string, number>();
  private readonly byteRanks = new Int32Array(256).fill(-1);
  private readonly pairRanks = new Map<number, number>();
  private readonly stage: Stage = byteLevelStage(false, true);

  /** `bytesOf(rank)` for ranks [0, count): no bytes where a rank is missing. */
  constructor(
    bytesOf: (rank: number) => Uint8Array,
    private readonly count: number,
  ) {
    for (let rank = 0; rank < count; rank++) {
      const bytes = bytesOf(rank);
      const key = Buffer.from(bytes).toString("latin1");
      this.keys.push(key);
      if (bytes.length > 0 && !this.rankByBytes.has(key)) this.rankByBytes.set(key, rank);
      if (bytes.length === 1 && this.byteRanks[bytes[0]] < 0) this.byteRanks[bytes[0]] = rank;
    }
  }

  /** GPT-2's pieces of `text`. */
  pieces(text: string, checkpoint?: () => void): string[] {
    return pretokenize(text, [this.stage], checkpoint);
  }

  /** The ids of one piece (every byte has a rank: the rank files are checked for it at load). */
  encodePiece(piece: string, checkpoint?: () => void): number[] {
    const bytes = Buffer.from(piece, "utf8");
    const whole = this.rankByBytes.get(bytes.toString("latin1"));
    if (whole !== undefined) return [whole];
    const symbols = Array.from(bytes, (b) => this.byteRanks[b]);
    return mergeByRank(symbols, (l, r) => this.pairRank(l, r), (rank) => rank, checkpoint);
  }

  private pairRank(left: number, right: number): number {
    const pair = left * this.count + right;
    let rank = this.pairRanks.get(pair);
    if (rank === undefined) {
      if (this.pairRanks.size >= PAIR_CACHE_ENTRIES) this.pairRanks.clear();
      rank = this.rankByBytes.get(this.keys[left] + this.keys[right]) ?? -1;
      this.pairRanks.set(pair, rank);
    }
    return rank;
  }
}
