// Progress of a long command (model quantize, model export-gguf, bench) on
// stderr. On a terminal: one bar redrawn in place with the percentage, the
// time spent and an estimate of the time left. Anywhere else (a log file, a
// pipe, CI): a plain line each time another tenth of the work is done, or
// after LINE_INTERVAL_MS without one, so a log shows the work moving
// without being flooded; the last line says 100%.

/** Reports `done` units of work out of `total` (any unit: elements, bytes, tokens). */
export type ProgressCallback = (done: number, total: number) => void;

/** Where progress is drawn: process.stderr, or a stand-in in tests. */
export interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

export interface ProgressOptions {
  /** Milliseconds on a monotonic clock (performance.now by default). */
  now?: () => number;
}

/** A plain line at least this often while the work moves (non-terminal output). */
export const LINE_INTERVAL_MS = 5000;
/** Redraws of the terminal bar at most this often. */
const REDRAW_INTERVAL_MS = 100;
const ETA_MIN_FRACTION = 0.01;
/** Columns kept for the label's brackets and the text after the bar. */
const BAR_TEXT_ROOM = 44;
const BAR_MIN = 10;
const BAR_MAX = 40;

/** "850 ms", "4.2 s", "3 min 05 s", "1 h 02 min". */
export function formatDuration(ms: number): string {
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${String(whole % 60).padStart(2, "0")} s`;
  const minutes = Math.round(whole / 60);
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

export class Progress {
  private readonly now: () => number;
  private readonly start: number;
  private readonly tty: boolean;
  private fraction = 0;
  private lastDraw = Number.NEGATIVE_INFINITY;
  private lastTenth = 0;
  private drawn = false;
  private ended = false;

  constructor(
    private readonly label: string,
    private readonly out: ProgressStream,
    opts: ProgressOptions = {},
  ) {
    this.now = opts.now ?? (() => performance.now());
    this.start = this.now();
    this.tty = out.isTTY === true;
  }

  /** Records progress; draws when the terminal bar is due or a plain line is. Never goes backwards. */
  readonly update: ProgressCallback = (done, total) => {
    if (this.ended || !(total > 0)) return;
    const fraction = Math.min(1, Math.max(this.fraction, done / total));
    if (fraction === this.fraction && this.drawn) return;
    this.fraction = fraction;
    const t = this.now();
    if (this.tty) {
      if (t - this.lastDraw >= REDRAW_INTERVAL_MS) this.drawBar(t);
      return;
    }
    // The 100% line is finish()'s, so a plain log has exactly one.
    const tenth = Math.floor(fraction * 10);
    if (fraction < 1 && (tenth > this.lastTenth || t - this.lastDraw >= LINE_INTERVAL_MS)) {
      this.lastTenth = Math.max(this.lastTenth, tenth);
      this.writeLine(t);
    }
  };

  /** The work is complete: the bar at 100% (then a newline), or the last plain line. */
  finish(): void {
    if (this.ended) return;
    this.fraction = 1;
    const t = this.now();
    if (this.tty) {
      this.drawBar(t);
      this.out.write("\n");
    } else {
      this.writeLine(t);
    }
    this.ended = true;
  }

  /** The work stopped early (an error follows): ends the bar's line so the message starts on its own. */
  abandon(): void {
    if (this.ended) return;
    if (this.tty && this.drawn) this.out.write("\n");
    this.ended = true;
  }

  private percent(): string {
    // 99.96% is not done: never round up to 100 before finish().
    return `${Math.floor(this.fraction * 100)}%`;
  }

  private timing(t: number): string {
    const elapsed = t - this.start;
    if (this.fraction >= 1) return `done in ${formatDuration(elapsed)}`;
    // Below 1% the estimate is mostly start-up cost: not worth showing.
    if (this.fraction < ETA_MIN_FRACTION) return `${formatDuration(elapsed)} elapsed`;
    const left = (elapsed * (1 - this.fraction)) / this.fraction;
    return `${formatDuration(elapsed)} elapsed, ETA ${formatDuration(left)}`;
  }

  private writeLine(t: number): void {
    this.out.write(`${this.label}: ${this.percent()} (${this.timing(t)})\n`);
    this.lastDraw = t;
    this.drawn = true;
  }

  private drawBar(t: number): void {
    const text = ` ${this.percent().padStart(4)}  ${this.timing(t)}`;
    // A fixed width from the terminal's, not from the text, so the bar does not jump.
    const room = (this.out.columns || 80) - this.label.length - BAR_TEXT_ROOM;
    const width = Math.max(BAR_MIN, Math.min(BAR_MAX, room));
    const filled = Math.round(this.fraction * width);
    const bar = `${"#".repeat(filled)}${"-".repeat(width - filled)}`;
    // \r back to the line start, \x1b[K clears what a longer previous draw left.
    this.out.write(`\r${this.label} [${bar}]${text}\x1b[K`);
    this.lastDraw = t;
    this.drawn = true;
  }
}

/**
 * Runs `work` with a progress display on `out` (none when `out` is
 * undefined): finished at 100% when the work returns, its line ended
 * cleanly when it throws.
 */
export function withProgress<T>(label: string, out: ProgressStream | undefined, work: (onProgress?: ProgressCallback) => T): T {
  const progress = out ? new Progress(label, out) : undefined;
  try {
    const result = work(progress?.update);
    progress?.finish();
    return result;
  } finally {
    progress?.abandon();
  }
}
