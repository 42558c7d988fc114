// The playground page's entry point (bundled into the page by bundle.ts):
// reads the model's description, then sets up the two views, the tabs
// between them, the metrics panel and the API key form.
import { KEY_NEEDED_EVENT, loadModelSummary, type ModelSummary, setApiKey } from "./api.ts";
import { setUpDepthExplorer } from "./depth.ts";
import { byId } from "./dom.ts";
import { setUpGenerate } from "./generate.ts";
import { setUpMetricsPanel } from "./metrics_panel.ts";

function setUpTabs(): void {
  const tabs = [...document.querySelectorAll<HTMLButtonElement>("[role=tab]")];
  const select = (chosen: HTMLButtonElement) => {
    for (const tab of tabs) {
      const selected = tab === chosen;
      tab.setAttribute("aria-selected", String(selected));
      byId(tab.getAttribute("aria-controls") ?? "").hidden = !selected;
    }
  };
  for (const tab of tabs) tab.addEventListener("click", () => select(tab));
}

/** The API key form: shown when the server answers 401; a saved key reloads the page with it. */
function setUpKeyForm(): void {
  const form = byId<HTMLFormElement>("key-form");
  window.addEventListener(KEY_NEEDED_EVENT, () => {
    form.hidden = false;
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey(byId<HTMLInputElement>("api-key").value.trim());
    location.reload();
  });
}

async function start(): Promise<void> {
  setUpKeyForm();
  setUpTabs();
  setUpMetricsPanel();
  const line = byId("model-line");
  let model: ModelSummary;
  try {
    model = await loadModelSummary();
  } catch (e) {
    // The views still work if the server comes back; requests will say what is wrong.
    model = { id: null, defaultLoops: null, description: `cannot read the model's description: ${(e as Error).message}` };
  }
  line.textContent = model.description;
  line.dataset.loaded = String(model.defaultLoops !== null);
  setUpGenerate(model);
  setUpDepthExplorer(model);
  document.body.dataset.ready = "true";
}

void start();
