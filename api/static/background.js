// The chat's progress strip: the session's background work that has not come home yet, with
// how long each piece has been at it, its step (a model call, a tool, a command) and its last
// output line, a ✕ that stops it, and a command that waits for the user's approval (it
// starts only once approved, so it is not running yet). The list comes from the server (the
// ledger, where whichever server runs the work writes its progress); while anything runs the
// strip asks for it again every few seconds, and the elapsed times tick in the browser.

import { clear, el, formatDuration, toDate } from "/static/dom.js";

const REFRESH_MS = 2000;

export class BackgroundStrip {
  /**
   * `onCancel(id)` stops a unit (a promise); `onRefresh()` fetches the list again and calls
   * `show` with it.
   */
  constructor(root, { onCancel = null, onRefresh = null } = {}) {
    this.root = root;
    this.work = [];
    this.approval = null;
    this.timer = 0;
    this.refresher = 0;
    this.onCancel = onCancel;
    this.onRefresh = onRefresh;
  }

  /** Show `work` ([{id, kind, goal, state, started_at, step, line}]); nothing hides it. */
  show(work) {
    this.work = Array.isArray(work) ? work : [];
    this.render();
  }

  /** The session's pending approval (an `Approval`), or null once there is none. */
  setApproval(approval) {
    const pending = approval && (approval.status || "pending") === "pending" ? approval : null;
    if (!pending && !this.approval) return;
    this.approval = pending;
    this.render();
  }

  clear() {
    this.approval = null;
    this.show([]);
  }

  render() {
    clear(this.root);
    const waiting = this.approval;
    this.root.hidden = this.work.length === 0 && !waiting;
    for (const item of this.work) {
      const what = item.kind === "process" ? "Command" : "Task";
      const progress = [item.step, item.line].filter(Boolean).join(" · ");
      this.root.append(
        el(
          "div",
          {
            class: "background-work",
            dataset: { testid: "background-work", state: item.state, id: item.id },
            role: "status",
          },
          el("span", { class: "spinner", "aria-hidden": "true" }),
          el("span", { class: "background-label", text: `${what} ${item.state}:` }),
          el(
            "span",
            { class: "background-what" },
            el("span", { class: "background-goal", text: item.goal || item.id }),
            el("span", {
              class: "background-progress",
              dataset: { testid: "background-progress" },
              text: progress,
              title: progress,
            }),
          ),
          el("span", { class: "background-elapsed", dataset: { field: "elapsed" } }),
          this.cancelButton(item),
        ),
      );
    }
    if (waiting) {
      this.root.append(
        el(
          "div",
          {
            class: "background-work",
            dataset: { testid: "background-work", state: "approval", id: waiting.id },
            role: "status",
          },
          el("span", { class: "background-label", text: "Command waiting for approval:" }),
          el("span", { class: "background-goal", text: String(waiting.command ?? "") }),
        ),
      );
    }
    clearInterval(this.timer);
    this.timer = this.work.length ? setInterval(() => this.tick(), 1000) : 0;
    this.tick();
    this.scheduleRefresh();
  }

  cancelButton(item) {
    const what = item.kind === "process" ? "command" : "task";
    const button = el("button", {
      type: "button",
      class: "icon-btn background-cancel",
      text: "✕",
      title: `Stop this ${what}`,
      "aria-label": `Stop this ${what}: ${item.goal || item.id}`,
      dataset: { testid: "background-cancel" },
    });
    button.hidden = !this.onCancel;
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await this.onCancel(item.id);
        this.work = this.work.filter((w) => w.id !== item.id);
        this.render();
      } catch {
        button.disabled = false; // it can be tried again; the error was said elsewhere
      }
    });
    return button;
  }

  /** While anything runs, fetch the list again in a moment: progress is written by the
   *  server that runs it, which may not be this one. */
  scheduleRefresh() {
    clearTimeout(this.refresher);
    this.refresher =
      this.work.length && this.onRefresh ? setTimeout(() => this.onRefresh(), REFRESH_MS) : 0;
  }

  tick() {
    const nodes = this.root.querySelectorAll("[data-field=elapsed]");
    this.work.forEach((item, index) => {
      const since = toDate(item.started_at);
      if (!since || !nodes[index]) return;
      const seconds = Math.max(0, Math.floor((Date.now() - since.getTime()) / 1000));
      nodes[index].textContent = seconds < 60 ? `${seconds} s` : formatDuration(seconds);
    });
  }
}
