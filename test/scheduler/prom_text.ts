// A strict parser of the Prometheus text exposition format 0.0.4, for tests:
// every line must be a HELP, a TYPE, a comment, blank, or a sample of a family
// declared by a TYPE line above it; histograms must be well formed.
export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped";

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  name: string;
  type: MetricType;
  help: string | undefined;
  samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set(["counter", "gauge", "histogram", "summary", "untyped"]);

// Go's strconv.ParseFloat, which Prometheus uses, takes Inf and NaN in any
// case (prom-client writes "Nan").
function parseValue(s: string, line: string): number {
  if (/^\+?inf$/i.test(s)) return Infinity;
  if (/^-inf$/i.test(s)) return -Infinity;
  if (/^nan$/i.test(s)) return NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(s)) throw new Error(`bad sample value '${s}' in: ${line}`);
  return Number(s);
}

function parseLabels(body: string, line: string): Record<string, string> {
  const labels: Record<string, string> = {};
  let i = 0;
  while (i < body.length) {
    const eq = body.indexOf("=", i);
    if (eq < 0) throw new Error(`bad labels in: ${line}`);
    const key = body.slice(i, eq).trim();
    if (!LABEL.test(key)) throw new Error(`bad label name '${key}' in: ${line}`);
    if (body[eq + 1] !== '"') throw new Error(`label value not quoted in: ${line}`);
    let j = eq + 2;
    let v = "";
    for (; j < body.length && body[j] !== '"'; j++) {
      if (body[j] === "\\") {
        const n = body[++j];
        if (n === "n") v += "\n";
        else if (n === "\\" || n === '"') v += n;
        else throw new Error(`bad escape in: ${line}`);
      } else v += body[j];
    }
    if (body[j] !== '"') throw new Error(`unterminated label value in: ${line}`);
    if (key in labels) throw new Error(`duplicate label '${key}' in: ${line}`);
    labels[key] = v;
    i = j + 1;
    if (body[i] === ",") i++;
    else if (i < body.length) throw new Error(`expected ',' between labels in: ${line}`);
  }
  return labels;
}

/** The family a sample name belongs to, given the declared families. */
function familyOf(name: string, families: Map<string, Family>): Family | undefined {
  const direct = families.get(name);
  if (direct) return direct;
  for (const suffix of ["_bucket", "_sum", "_count"]) {
    if (!name.endsWith(suffix)) continue;
    const f = families.get(name.slice(0, -suffix.length));
    if (f && (f.type === "histogram" || (f.type === "summary" && suffix !== "_bucket"))) return f;
  }
  return undefined;
}

export function parsePrometheusText(text: string): Map<string, Family> {
  const families = new Map<string, Family>();
  const helps = new Map<string, string>();
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (!m) continue; // a plain comment
      const [, kw, name, rest] = m;
      if (!NAME.test(name)) throw new Error(`bad metric name '${name}' in: ${line}`);
      if (kw === "HELP") {
        if (helps.has(name)) throw new Error(`second HELP for ${name}`);
        helps.set(name, rest);
        const f = families.get(name);
        if (f) f.help = rest;
      } else {
        if (!TYPES.has(rest)) throw new Error(`bad type '${rest}' in: ${line}`);
        if (families.has(name)) throw new Error(`second TYPE for ${name}`);
        families.set(name, { name, type: rest as MetricType, help: helps.get(name), samples: [] });
      }
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$/.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const [, name, , labelBody, value] = m;
    const fam = familyOf(name, families);
    if (!fam) throw new Error(`sample ${name} has no TYPE line before it`);
    fam.samples.push({ name, labels: labelBody ? parseLabels(labelBody, line) : {}, value: parseValue(value, line) });
  }
  for (const f of families.values()) if (f.type === "histogram") checkHistogram(f);
  return families;
}

function checkHistogram(f: Family): void {
  const series = new Map<string, Sample[]>();
  const key = (s: Sample) =>
    JSON.stringify(Object.entries(s.labels).filter(([k]) => k !== "le").sort());
  for (const s of f.samples) series.set(key(s), [...(series.get(key(s)) ?? []), s]);
  for (const samples of series.values()) {
    const buckets = samples.filter((s) => s.name === `${f.name}_bucket`);
    const count = samples.find((s) => s.name === `${f.name}_count`);
    const sum = samples.find((s) => s.name === `${f.name}_sum`);
    if (!count || !sum || buckets.length === 0) throw new Error(`histogram ${f.name} lacks _bucket, _sum or _count`);
    let prevLe = -Infinity;
    let prev = 0;
    for (const b of buckets) {
      if (!("le" in b.labels)) throw new Error(`bucket of ${f.name} without le`);
      const le = parseValue(b.labels.le, b.labels.le);
      if (!(le > prevLe)) throw new Error(`buckets of ${f.name} not in increasing le order`);
      if (b.value < prev) throw new Error(`buckets of ${f.name} not cumulative`);
      prevLe = le;
      prev = b.value;
    }
    if (prevLe !== Infinity) throw new Error(`histogram ${f.name} lacks the +Inf bucket`);
    if (prev !== count.value) throw new Error(`histogram ${f.name}: +Inf bucket ${prev} != count ${count.value}`);
  }
}

/** The value of an unlabelled sample (counter, gauge, or histogram _count/_sum). */
export function sampleValue(families: Map<string, Family>, sampleName: string): number {
  const fam = familyOf(sampleName, families);
  const s = fam?.samples.find((x) => x.name === sampleName && Object.keys(x.labels).length === 0);
  if (!s) throw new Error(`no sample ${sampleName}`);
  return s.value;
}

// The /metrics series of docs/http.md#ops, by kind.
export const SPEC_SERIES: Record<string, "gauge" | "counter" | "histogram"> = {
  service_max_seq_len: "gauge",
  service_default_loops: "gauge",
  service_up_timestamp_seconds: "gauge",
  service_queue_depth: "gauge",
  service_requests_in_flight: "gauge",
  service_requests_submitted_total: "counter",
  service_requests_rejected_total: "counter",
  service_requests_completed_total: "counter",
  service_requests_errored_total: "counter",
  service_requests_cancelled_total: "counter",
  service_prefix_pool_hits_total: "counter",
  service_request_body_timeouts_total: "counter",
  service_queue_wait_ms: "histogram",
  service_dispatch_ms: "histogram",
  service_first_token_ms: "histogram",
  service_request_wall_ms: "histogram",
};
// And the speculative-decoding token counters (src/metrics.ts).
export const SPECULATIVE_SERIES: Record<string, "counter" | "histogram"> = {
  service_spec_draft_tokens_total: "counter",
  service_spec_accepted_tokens_total: "counter",
  // and learned early exit's (docs/early-exit.md)
  service_exit_steps: "histogram",
};
// And the batching series (docs/batching.md).
export const BATCHING_SERIES: Record<string, "gauge" | "counter" | "histogram"> = {
  service_kv_cache_budget_bytes: "gauge",
  service_kv_cache_bytes_in_use: "gauge",
  service_kv_cache_bytes_allocated: "gauge",
  service_generated_tokens_total: "counter",
  service_prompt_tokens_total: "counter",
  service_engine_step_seconds_total: "counter",
  service_batch_rows: "histogram",
};
