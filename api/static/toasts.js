// Toasts: a completion that landed in a session not in view, or a short notice. Text only.
import { el } from "/static/dom.js";

const root = () => document.getElementById("toasts");

function show(node, timeoutMs) {
  root().append(node);
  requestAnimationFrame(() => node.classList.add("in"));
  const close = () => {
    node.classList.remove("in");
    setTimeout(() => node.remove(), 200);
  };
  const timer = setTimeout(close, timeoutMs);
  node.addEventListener("mouseenter", () => clearTimeout(timer), { once: true });
  return close;
}

/** A completion toast: {title, goal, status}; `onOpen` opens the session. */
export function completionToast({ sessionId, title, goal, status }, onOpen) {
  let close = () => {};
  const ok = ["done", "completed", "success", "succeeded", "ok"].includes(String(status));
  const node = el(
    "div",
    {
      class: "toast",
      role: "status",
      dataset: { testid: "toast", sessionId, status: status || "" },
    },
    el("span", { class: `toast-dot ${ok ? "ok" : "warn"}`, "aria-hidden": "true" }),
    el(
      "button",
      {
        type: "button",
        class: "toast-body",
        on: {
          click: () => {
            close();
            onOpen(sessionId);
          },
        },
      },
      el("span", { class: "toast-title", text: `Background work finished in “${title || "a session"}”` }),
      el("span", { class: "toast-goal", text: goal || "" }),
      el("span", { class: "toast-status", text: status ? `Status: ${status}` : "" }),
    ),
    el("button", {
      type: "button",
      class: "toast-close",
      "aria-label": "Dismiss",
      text: "×",
      on: { click: () => close() },
    }),
  );
  close = show(node, 10000);
}

/** A short notice (errors, refusals). */
export function notice(message, kind = "error") {
  let close = () => {};
  const node = el(
    "div",
    { class: `toast notice ${kind}`, role: kind === "error" ? "alert" : "status", dataset: { testid: "notice" } },
    el("span", { class: `toast-dot ${kind === "error" ? "err" : "ok"}`, "aria-hidden": "true" }),
    el("span", { class: "toast-body", text: message }),
    el("button", {
      type: "button",
      class: "toast-close",
      "aria-label": "Dismiss",
      text: "×",
      on: { click: () => close() },
    }),
  );
  close = show(node, 6000);
}

/** A failed request as a notice; one that never reached the server shows the reconnecting
 * banner instead (api.js reports it), so it raises no toast here. */
export function failure(err, fallback = "Something went wrong") {
  if (err?.network) return;
  notice(err?.message || fallback);
}
