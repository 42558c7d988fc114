// The Prometheus text format as /metrics serves it, reduced to what the
// metrics panel shows: sample values by series, and per-second rates from
// the change of a counter between two scrapes.

/** Sample values keyed by series: the metric name, with its labels when it has any (`name{a="b"}`). */
export type Samples = Map<string, number>;

/** Parses exposition text; comment lines and unparsable lines are skipped. */
export function parsePrometheus(text: string): Samples {
  const samples: Samples = new Map();
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    // series, value, optional timestamp; label values may contain spaces, so split after the closing brace.
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?)\s+(\S+)(?:\s+\S+)?$/.exec(line);
    if (!m) continue;
    const value = sampleValue(m[2]);
    if (value !== null) samples.set(m[1], value);
  }
  return samples;
}

/** A sample value as Prometheus reads it (Inf and NaN in any case: prom-client writes "Nan"); null if it is none. */
function sampleValue(text: string): number | null {
  if (/^\+?inf$/i.test(text)) return Number.POSITIVE_INFINITY;
  if (/^-inf$/i.test(text)) return Number.NEGATIVE_INFINITY;
  if (/^nan$/i.test(text)) return Number.NaN;
  const n = Number(text);
  return text.trim() === "" || Number.isNaN(n) ? null : n;
}

/** Per-second rate of a counter from consecutive scrapes; null until there are two (or after a reset). */
export class CounterRate {
  private last: { value: number; atMs: number } | null = null;

  sample(value: number, atMs: number): number | null {
    const prev = this.last;
    this.last = { value, atMs };
    if (!prev || atMs <= prev.atMs || value < prev.value) return null;
    return ((value - prev.value) * 1000) / (atMs - prev.atMs);
  }
}
