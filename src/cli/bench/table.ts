// Benchmark output: an aligned text table on stdout, and the median that
// every figure in it is.

export type Row = Record<string, string | number>;

export function printTable(title: string, rows: Row[]): void {
  if (rows.length === 0) return;
  console.log(`\n${formatTable(title, rows)}`);
}

/** The aligned text table printTable prints: title, header, rule, rows. */
export function formatTable(title: string, rows: Row[]): string {
  const cols = rows.length > 0 ? Object.keys(rows[0]) : [];
  const cell = (v: string | number) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(2)) : v);
  const width = cols.map((c) => Math.max(c.length, ...rows.map((r) => cell(r[c] ?? "").length)));
  const line = (vals: string[]) => vals.map((v, i) => v.padStart(width[i])).join("  ");
  return [title, line(cols), line(width.map((w) => "-".repeat(w))), ...rows.map((r) => line(cols.map((c) => cell(r[c] ?? ""))))].join("\n");
}

/** Median of a few repeats: robust to the odd slow run on a shared machine. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}
