// Tiny DOM helpers. Every string child becomes a Text node: nothing here parses HTML.

/**
 * el("div", {class: "x", dataset: {testid: "y"}}, "text", childNode)
 * Attributes are set with setAttribute (never innerHTML); `on*` keys are not accepted as
 * attributes, listeners go through the `on` object.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") {
      for (const [type, fn] of Object.entries(value)) node.addEventListener(type, fn);
    } else if (key === "dataset") {
      for (const [k, v] of Object.entries(value)) {
        if (v !== undefined && v !== null) node.dataset[k] = String(v);
      }
    } else if (key === "text") {
      node.textContent = String(value);
    } else if (key.startsWith("on")) {
      throw new Error(`refusing inline handler attribute ${key}`);
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, ...children);
  return node;
}

export function append(node, ...children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
  return node;
}

export const $ = (selector, root = document) => root.querySelector(selector);

/** Seconds or ISO string → Date (or null). */
export function toDate(value) {
  if (value === undefined || value === null || value === "") return null;
  if (typeof value === "number") return new Date(value < 1e12 ? value * 1000 : value);
  const asNumber = Number(value);
  if (!Number.isNaN(asNumber) && /^\d+(\.\d+)?$/.test(String(value))) return toDate(asNumber);
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date;
}

export function relativeTime(value) {
  const date = toDate(value);
  if (!date) return "";
  const seconds = Math.round((Date.now() - date.getTime()) / 1000);
  if (seconds < 45) return "just now";
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 24) return `${hours} h ago`;
  return date.toLocaleDateString(undefined, { month: "short", day: "numeric" });
}

export function formatDuration(seconds) {
  if (seconds === undefined || seconds === null || Number.isNaN(Number(seconds))) return "";
  const s = Number(seconds);
  if (s < 1) return `${Math.max(1, Math.round(s * 1000))} ms`;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  const rest = Math.round(s % 60);
  if (m < 60) return `${m} min ${rest} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** Compare two event ids ("strings, increasing"): numeric when both are digits. */
export function compareIds(a, b) {
  const x = String(a ?? "");
  const y = String(b ?? "");
  if (/^\d+$/.test(x) && /^\d+$/.test(y)) {
    const xs = x.replace(/^0+(?=\d)/, "");
    const ys = y.replace(/^0+(?=\d)/, "");
    if (xs.length !== ys.length) return xs.length < ys.length ? -1 : 1;
  }
  return x < y ? -1 : x > y ? 1 : 0;
}

export const SOURCE_LABELS = {
  webui: "Web",
  api_server: "API",
  telegram: "Telegram",
  discord: "Discord",
  slack: "Slack",
  cli: "CLI",
};

export function sourceLabel(source) {
  if (!source) return "?";
  return SOURCE_LABELS[source] || String(source).replace(/_/g, " ");
}
