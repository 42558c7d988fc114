// Regular expressions a model's tokenizer carries, run in time linear in the
// text. A tokenizer.json is untrusted input, and a backtracking engine (the
// one behind RegExp) spends exponential time on a pattern such as `(a+)+b`
// or quadratic time on `\s*[\r\n]+` over a run of spaces: one prompt would
// hold a thread for minutes. Linear engines (RE2 and its ports) lack the
// lookarounds every tokenizer pattern uses (`\s+(?!\S)`), so this is a
// backtracking matcher over a compiled program that never explores the
// same (instruction, position) twice (RE2's "bit state" search): a state
// reached again after its first exploration failed fails again, because
// nothing else (no back-reference, no capture) decides a match. The memo is
// kept across the searches of one text, so finding every match costs at
// most (instructions x characters) steps in all, and each lookaround is
// answered once per position. Matches are exactly RegExp's (flags `u`),
// found in the same priority order; single characters are tested by
// RegExp itself, so classes, properties and case folding mean what they
// mean there.
//
// Accepted: literals, escapes, classes, `.`, groups (capturing, named,
// non-capturing, `(?i:...)`), alternation, greedy and lazy quantifiers, and
// lookarounds. Refused: anchors, word boundaries, back-references, and a
// repeated part that can match nothing (`(a*)*`), whose empty iterations
// RegExp treats specially.

export class PatternError extends Error {}

/** Programs longer than this are refused (counted repetition multiplies a part: `\p{L}{1000}`). */
const MAX_INSTRUCTIONS = 2048;
/** How many steps between checkpoint calls (a cancelled encode stops there). */
const CHECKPOINT_STEPS = 1 << 16;

// ---- syntax tree ----

type Node =
  | { kind: "char"; test: number }
  | { kind: "seq"; items: Node[] }
  | { kind: "alt"; branches: Node[] }
  | { kind: "repeat"; body: Node; min: number; max: number; greedy: boolean }
  | { kind: "look"; body: Node; behind: boolean; negate: boolean };

/** One character's test: a code point compared, or a one-character RegExp asked once per code point. */
class CharTest {
  private readonly bmp = new Uint8Array(0x10000); // 0 not asked yet, 1 no, 2 yes
  private readonly astral = new Map<number, boolean>();

  constructor(
    private readonly literal: number,
    private readonly re: RegExp | null,
  ) {}

  test(cp: number): boolean {
    if (this.re === null) return cp === this.literal;
    if (cp < 0x10000) {
      const known = this.bmp[cp];
      if (known !== 0) return known === 2;
      const yes = this.re.test(String.fromCharCode(cp));
      this.bmp[cp] = yes ? 2 : 1;
      return yes;
    }
    let yes = this.astral.get(cp);
    if (yes === undefined) {
      yes = this.re.test(String.fromCodePoint(cp));
      this.astral.set(cp, yes);
    }
    return yes;
  }
}

const SYNTAX_CHARS = new Set("^$\\.*+?()[]{}|/".split(""));

class Parser {
  private i = 0;
  readonly tests: CharTest[] = [];
  private readonly testIds = new Map<string, number>();

  constructor(private readonly src: string) {}

  parse(): Node {
    const node = this.alternation(false);
    if (this.i < this.src.length) throw new PatternError(`unexpected ${JSON.stringify(this.src[this.i])} at ${this.i}`);
    return node;
  }

  private fail(msg: string): never {
    throw new PatternError(msg);
  }

  private test(source: string, ignoreCase: boolean, literal: number): Node {
    const key = `${ignoreCase ? "i" : "-"}${source}`;
    let id = this.testIds.get(key);
    if (id === undefined) {
      id = this.tests.length;
      this.tests.push(ignoreCase || literal < 0 ? new CharTest(-1, new RegExp(source, ignoreCase ? "iu" : "u")) : new CharTest(literal, null));
      this.testIds.set(key, id);
    }
    return { kind: "char", test: id };
  }

  private alternation(ignoreCase: boolean): Node {
    const branches = [this.sequence(ignoreCase)];
    while (this.src[this.i] === "|") {
      this.i++;
      branches.push(this.sequence(ignoreCase));
    }
    return branches.length === 1 ? branches[0] : { kind: "alt", branches };
  }

  private sequence(ignoreCase: boolean): Node {
    const items: Node[] = [];
    while (this.i < this.src.length && this.src[this.i] !== "|" && this.src[this.i] !== ")") items.push(this.quantified(ignoreCase));
    return items.length === 1 ? items[0] : { kind: "seq", items };
  }

  private quantified(ignoreCase: boolean): Node {
    const body = this.atom(ignoreCase);
    const rest = this.src.slice(this.i);
    const m = /^(?:([*+?])|\{(\d+)(,(\d*))?\})(\??)/.exec(rest);
    if (m === null) return body;
    this.i += m[0].length;
    let min: number;
    let max: number;
    if (m[1] !== undefined) {
      min = m[1] === "+" ? 1 : 0;
      max = m[1] === "?" ? 1 : Number.POSITIVE_INFINITY;
    } else {
      min = Number(m[2]);
      max = m[3] === undefined ? min : m[4] === "" ? Number.POSITIVE_INFINITY : Number(m[4]);
    }
    if (min > MAX_INSTRUCTIONS || (Number.isFinite(max) && max > MAX_INSTRUCTIONS)) this.fail(`the repetition ${m[0]} is too large`);
    if (max > 1 && nullable(body)) this.fail(`a repeated part that can match nothing (before ${m[0]}) is not supported`);
    return { kind: "repeat", body, min, max, greedy: m[5] === "" };
  }

  private atom(ignoreCase: boolean): Node {
    const s = this.src;
    const c = s[this.i];
    if (c === "(") return this.group(ignoreCase);
    if (c === "[") {
      let j = this.i + 1;
      while (j < s.length && s[j] !== "]") j += s[j] === "\\" ? 2 : 1;
      if (j >= s.length) this.fail("unterminated character class");
      const source = s.slice(this.i, j + 1);
      this.i = j + 1;
      return this.test(source, ignoreCase, -1);
    }
    if (c === "\\") return this.escape(ignoreCase);
    if (c === "^" || c === "$") this.fail(`the anchor ${c} is not supported`);
    if (c === ".") {
      this.i++;
      return this.test(".", ignoreCase, -1);
    }
    if (c === "*" || c === "+" || c === "?" || c === "{") this.fail(`nothing to repeat at ${this.i}`);
    const cp = s.codePointAt(this.i) as number;
    const ch = String.fromCodePoint(cp);
    this.i += ch.length;
    return this.test(SYNTAX_CHARS.has(ch) ? `\\${ch}` : ch, ignoreCase, cp);
  }

  private escape(ignoreCase: boolean): Node {
    const s = this.src;
    const start = this.i;
    const e = s[this.i + 1];
    if (e === undefined) this.fail("the pattern ends in a lone backslash");
    this.i += 2;
    if (e === "p" || e === "P") {
      const end = s.indexOf("}", this.i);
      if (s[this.i] !== "{" || end < 0) this.fail(`\\${e} must be followed by {Property}`);
      this.i = end + 1;
    } else if (e === "x") {
      this.i += 2;
    } else if (e === "u") {
      if (s[this.i] === "{") this.i = s.indexOf("}", this.i) + 1;
      else {
        this.i += 4;
        // A surrogate pair written as two escapes is one code point in `u` mode.
        const high = Number.parseInt(s.slice(start + 2, this.i), 16);
        if (high >= 0xd800 && high <= 0xdbff && /^\\u[dD][c-fC-F][0-9a-fA-F]{2}/.test(s.slice(this.i))) this.i += 6;
      }
    } else if (e === "c") {
      this.i += 1;
    } else if (e === "b" || e === "B") {
      this.fail(`the word boundary \\${e} is not supported`);
    } else if (/[1-9k]/.test(e)) {
      this.fail("back-references are not supported");
    }
    return this.test(s.slice(start, this.i), ignoreCase, -1);
  }

  private group(ignoreCase: boolean): Node {
    const s = this.src;
    this.i++;
    let look: { behind: boolean; negate: boolean } | null = null;
    let flags = ignoreCase;
    const head = /^\?(?::|=|!|<=|<!|<[A-Za-z_$][\w$]*>|([a-z]*)(?:-([a-z]*))?:)/.exec(s.slice(this.i));
    if (s[this.i] === "?") {
      if (head === null) this.fail(`unsupported group at ${this.i - 1}`);
      const h = head[0];
      if (h === "?=" || h === "?!" || h === "?<=" || h === "?<!") look = { behind: h.startsWith("?<"), negate: h.endsWith("!") };
      else if (head[1] !== undefined || head[2] !== undefined) {
        const on = head[1] ?? "";
        const off = head[2] ?? "";
        if (/[^i]/.test(on + off)) this.fail(`the modifiers (${h.slice(0, -1)}) are not supported (only i)`);
        if (on.includes("i")) flags = true;
        if (off.includes("i")) flags = false;
      }
      this.i += h.length;
    }
    const body = this.alternation(flags);
    if (s[this.i] !== ")") this.fail("unterminated group");
    this.i++;
    return look === null ? body : { kind: "look", body, ...look };
  }
}

function nullable(n: Node): boolean {
  switch (n.kind) {
    case "char":
      return false;
    case "seq":
      return n.items.every(nullable);
    case "alt":
      return n.branches.some(nullable);
    case "repeat":
      return n.min === 0 || nullable(n.body);
    case "look":
      return true;
  }
}

// ---- programs ----

const CHAR = 0;
const SPLIT = 1; // try a, then b
const JMP = 2;
const LOOK = 3; // lookaround a holds (b = 1) or does not hold (b = 0)
const MATCH = 4;

interface Program {
  op: number[];
  a: number[];
  b: number[];
  /** Reads leftwards (a lookbehind's body). */
  backward: boolean;
}

class Compiler {
  readonly programs: Program[] = [];
  size = 0;

  program(node: Node, backward: boolean): number {
    const p: Program = { op: [], a: [], b: [], backward };
    const index = this.programs.length;
    this.programs.push(p);
    this.emit(p, node);
    this.put(p, MATCH, 0, 0);
    return index;
  }

  private put(p: Program, op: number, a: number, b: number): number {
    if (++this.size > MAX_INSTRUCTIONS) throw new PatternError(`the pattern is too large (over ${MAX_INSTRUCTIONS} steps once repetitions are counted out)`);
    p.op.push(op);
    p.a.push(a);
    p.b.push(b);
    return p.op.length - 1;
  }

  private emit(p: Program, n: Node): void {
    switch (n.kind) {
      case "char":
        this.put(p, CHAR, n.test, 0);
        return;
      case "seq":
        for (const item of p.backward ? [...n.items].reverse() : n.items) this.emit(p, item);
        return;
      case "alt": {
        const jumps: number[] = [];
        n.branches.forEach((branch, k) => {
          const split = k < n.branches.length - 1 ? this.put(p, SPLIT, 0, 0) : -1;
          if (split >= 0) p.a[split] = split + 1;
          this.emit(p, branch);
          if (split >= 0) {
            jumps.push(this.put(p, JMP, 0, 0));
            p.b[split] = p.op.length;
          }
        });
        for (const j of jumps) p.a[j] = p.op.length;
        return;
      }
      case "repeat": {
        for (let k = 0; k < n.min; k++) this.emit(p, n.body);
        if (n.max === Number.POSITIVE_INFINITY) {
          const split = this.put(p, SPLIT, 0, 0);
          this.emit(p, n.body);
          this.put(p, JMP, split, 0);
          this.aim(p, split, split + 1, p.op.length, n.greedy);
          return;
        }
        const splits: number[] = [];
        for (let k = n.min; k < n.max; k++) {
          splits.push(this.put(p, SPLIT, 0, 0));
          this.emit(p, n.body);
        }
        for (const s of splits) this.aim(p, s, s + 1, p.op.length, n.greedy);
        return;
      }
      case "look":
        this.put(p, LOOK, this.program(n.body, n.behind), n.negate ? 0 : 1);
        return;
    }
  }

  /** A split that prefers going on into the body (greedy) or past it (lazy). */
  private aim(p: Program, split: number, body: number, past: number, greedy: boolean): void {
    p.a[split] = greedy ? body : past;
    p.b[split] = greedy ? past : body;
  }
}

// ---- matching ----

export interface Match {
  start: number;
  end: number;
}

/** A compiled pattern; matches(text) finds RegExp's matches (flags `gu`) in linear time. */
export class LinearRegex {
  private readonly tests: CharTest[];
  private readonly programs: Program[];
  /** Each program's memo, kept from text to text (grown as needed, cleared as far as a text uses it). */
  private readonly memos: Memo[];
  /** Its steps (instructions, lookarounds' included): a search costs at most this many per character. */
  readonly size: number;

  /** `source`: a JavaScript pattern (flags `u`); PatternError when it is not one this engine runs. */
  constructor(readonly source: string) {
    try {
      new RegExp(source, "u");
    } catch (e) {
      throw new PatternError(`not a pattern this server can run: ${(e as Error).message}`);
    }
    const parser = new Parser(source);
    const tree = parser.parse();
    this.tests = parser.tests;
    const compiler = new Compiler();
    compiler.program(tree, false);
    this.programs = compiler.programs;
    this.size = compiler.size;
    this.memos = this.programs.map((p, i) => new Memo(p.op.length, i > 0));
  }

  /**
   * The successive matches of the pattern in `text`, as RegExp.exec with the
   * `g` flag finds them (an empty match is reported, and the search goes on
   * one character further). `checkpoint` is called every so many steps: it
   * may throw to stop the search.
   */
  matches(text: string, checkpoint?: () => void): Match[] {
    const run = new Run(text, this.programs, this.tests, this.memos, checkpoint);
    const out: Match[] = [];
    let from = 0;
    while (from <= text.length) {
      const m = run.search(from);
      if (m === null) break;
      out.push(m);
      from = m.end > m.start ? m.end : m.end + codePointLength(text, m.end);
    }
    return out;
  }
}

function codePointLength(text: string, at: number): number {
  return (text.codePointAt(at) ?? 0) > 0xffff ? 2 : 1;
}

/** The memo of one program: states explored (and, for a lookaround, those that lead to a match), over one text at a time. */
class Memo {
  visited = new Uint32Array(0);
  succeeds = new Uint32Array(0);
  /** Lookarounds: the answer at each position, 0 not asked, 1 no, 2 yes. */
  answers = new Uint8Array(0);
  /** The text it was last cleared for. */
  run: Run | null = null;

  constructor(
    private readonly size: number,
    readonly lookaround: boolean,
  ) {}

  /** Cleared for `positions` positions of a new text. */
  clear(positions: number, run: Run): void {
    const words = Math.ceil((this.size * positions) / 32);
    // Grown to the longest text so far; given back after a far shorter one.
    if (this.visited.length < words || this.visited.length > 4 * words + 65_536) {
      this.visited = new Uint32Array(words);
      if (this.lookaround) {
        this.succeeds = new Uint32Array(words);
        this.answers = new Uint8Array(positions);
      }
    } else {
      this.visited.fill(0, 0, words);
      if (this.lookaround) {
        this.succeeds.fill(0, 0, words);
        if (this.answers.length < positions) this.answers = new Uint8Array(positions);
        else this.answers.fill(0, 0, positions);
      }
    }
    this.run = run;
  }
}

const has = (bits: Uint32Array, i: number) => (bits[Math.floor(i / 32)] & (1 << i % 32)) !== 0;
const set = (bits: Uint32Array, i: number) => {
  bits[Math.floor(i / 32)] |= 1 << i % 32;
};
const clear = (bits: Uint32Array, i: number) => {
  bits[Math.floor(i / 32)] &= ~(1 << i % 32);
};

class Run {
  private steps = 0;
  // The explicit backtracking stack: an alternative's instruction, position and path length.
  private readonly stackPc: number[] = [];
  private readonly stackPos: number[] = [];
  private readonly stackPath: number[] = [];

  constructor(
    private readonly text: string,
    private readonly programs: Program[],
    private readonly tests: CharTest[],
    private readonly memos: Memo[],
    private readonly checkpoint: (() => void) | undefined,
  ) {}

  search(from: number): Match | null {
    const n = this.text.length;
    for (let start = from; start <= n; start += start < n ? codePointLength(this.text, start) : 1) {
      const end = this.run(0, start);
      if (end >= 0) return { start, end };
    }
    return null;
  }

  private memo(index: number): Memo {
    const memo = this.memos[index];
    if (memo.run !== this) memo.clear(this.text.length + 1, this);
    return memo;
  }

  private lookaround(index: number, pos: number): boolean {
    const answers = this.memo(index).answers;
    if (answers[pos] === 0) answers[pos] = this.run(index, pos) >= 0 ? 2 : 1;
    return answers[pos] === 2;
  }

  /** The end of the first match of program `index` from `start` in priority order, or -1. */
  private run(index: number, start: number): number {
    const { op, a, b, backward } = this.programs[index];
    const memo = this.memo(index);
    const { visited, lookaround } = memo;
    const size = op.length;
    const text = this.text;
    const n = text.length;
    // The states of the path being explored: on a match they lead to it;
    // when the search backtracks past them they have failed for good.
    const path: number[] = [];
    const base = this.stackPc.length;
    this.push(0, start, 0);
    while (this.stackPc.length > base) {
      let pc = this.stackPc.pop() as number;
      let pos = this.stackPos.pop() as number;
      path.length = this.stackPath.pop() as number;
      for (;;) {
        if (++this.steps % CHECKPOINT_STEPS === 0) this.checkpoint?.();
        const state = pos * size + pc;
        if (has(visited, state)) {
          if (lookaround && has(memo.succeeds, state)) return this.matched(path, memo, pos, base);
          break;
        }
        set(visited, state);
        path.push(state);
        const o = op[pc];
        if (o === CHAR) {
          let cp: number;
          let len = 1;
          if (backward) {
            if (pos === 0) break;
            cp = text.charCodeAt(pos - 1);
            if (cp >= 0xdc00 && cp <= 0xdfff && pos >= 2) {
              const high = text.charCodeAt(pos - 2);
              if (high >= 0xd800 && high <= 0xdbff) {
                cp = (high - 0xd800) * 0x400 + (cp - 0xdc00) + 0x10000;
                len = 2;
              }
            }
            if (!this.tests[a[pc]].test(cp)) break;
            pos -= len;
          } else {
            if (pos >= n) break;
            cp = text.codePointAt(pos) as number;
            if (cp > 0xffff) len = 2;
            if (!this.tests[a[pc]].test(cp)) break;
            pos += len;
          }
          pc++;
        } else if (o === SPLIT) {
          this.push(b[pc], pos, path.length);
          pc = a[pc];
        } else if (o === JMP) {
          pc = a[pc];
        } else if (o === LOOK) {
          if (this.lookaround(a[pc], pos) !== (b[pc] === 1)) break;
          pc++;
        } else {
          return this.matched(path, memo, pos, base);
        }
      }
    }
    return -1;
  }

  /** A match at `pos`: the states of its path lead to it, so they are not failures. */
  private matched(path: number[], memo: Memo, pos: number, base: number): number {
    if (memo.lookaround) for (const s of path) set(memo.succeeds, s);
    else for (const s of path) clear(memo.visited, s);
    this.stackPc.length = base;
    this.stackPos.length = base;
    this.stackPath.length = base;
    return pos;
  }

  private push(pc: number, pos: number, pathLength: number): void {
    this.stackPc.push(pc);
    this.stackPos.push(pos);
    this.stackPath.push(pathLength);
  }
}
