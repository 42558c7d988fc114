// DOM helpers for the playground's browser code. The references give every
// playground module the browser's types (the server code is type-checked
// in the same program; dom.asynciterable keeps its ReadableStream iterable).
/// <reference lib="dom" />
/// <reference lib="dom.iterable" />
/// <reference lib="dom.asynciterable" />

/** The element with this id; a missing one is a bug in index.html. */
export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (!found) throw new Error(`playground: #${id} is missing from the page`);
  return found as T;
}

/** A new element with a class and text. */
export function el<K extends keyof HTMLElementTagNameMap>(tag: K, className = "", text = ""): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

/** A labelled figure for a stats line: `<span data-stat=name><b>label</b> value</span>`. */
export function stat(name: string, label: string, value: string, title = ""): HTMLSpanElement {
  const node = el("span", "stat");
  node.dataset.stat = name;
  if (title) node.title = title;
  node.append(el("b", "", label), ` ${value}`);
  return node;
}

/** The value of a number input, or undefined when it is empty (the server's default then applies). */
export function numberOf(input: HTMLInputElement): number | undefined {
  return input.value.trim() === "" ? undefined : input.valueAsNumber;
}
