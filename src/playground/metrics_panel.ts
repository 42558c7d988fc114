// The metrics panel: the server's /metrics scraped every 2 s while the page
// is visible: queue depth and requests in flight as they are, requests per
// second from the change of the completed-requests counter, and the
// speculative drafts' acceptance so far.
import { getText } from "./api.ts";
import { byId } from "./dom.ts";
import { CounterRate, parsePrometheus } from "./prom.ts";

const METRICS_INTERVAL_MS = 2000;

export function setUpMetricsPanel(): void {
  const panel = byId("metrics");
  const queue = byId("m-queue");
  const inFlight = byId("m-inflight");
  const rate = byId("m-rate");
  const completed = byId("m-completed");
  const spec = byId("m-spec");
  const note = byId("m-note");
  const completions = new CounterRate();

  const show = (node: HTMLElement, value: number | undefined) => {
    node.textContent = value === undefined ? "–" : String(value);
  };

  const scrape = async () => {
    try {
      const samples = parsePrometheus(await getText("metrics"));
      const done = samples.get("service_requests_completed_total");
      show(queue, samples.get("service_queue_depth"));
      show(inFlight, samples.get("service_requests_in_flight"));
      show(completed, done);
      const perSecond = done === undefined ? null : completions.sample(done, performance.now());
      rate.textContent = perSecond === null ? "–" : perSecond.toFixed(perSecond < 10 ? 2 : 1);
      const drafted = samples.get("service_spec_draft_tokens_total") ?? 0;
      const accepted = samples.get("service_spec_accepted_tokens_total") ?? 0;
      spec.textContent = drafted > 0 ? `${drafted} / ${accepted} (${Math.round((100 * accepted) / drafted)}%)` : "–";
      note.textContent = `from /metrics, updated ${new Date().toLocaleTimeString()}`;
      panel.dataset.state = "ok";
    } catch (e) {
      note.textContent = `/metrics unavailable: ${(e as Error).message}`;
      panel.dataset.state = "error";
    }
  };

  const loop = async () => {
    if (!document.hidden) await scrape();
    setTimeout(() => void loop(), METRICS_INTERVAL_MS);
  };
  void loop();
}
