// The chat's progress strip: the session's background work that has not come home yet, with
// how long each piece has been at it, and a command that waits for the user's approval (it
// starts only once approved, so it is not running yet). The list comes from the server (the
// ledger), the approval from the session's detail and its `approval` events; the elapsed
// times tick in the browser, so nothing polls.

import { clear, el, formatDuration, toDate } from "/static/dom.js";

export class BackgroundStrip {
  constructor(root) {
    this.root = root;
    this.work = [];
    this.approval = null;
    this.timer = 0;
  }

  /** Show `work` ([{id, kind, goal, state, started_at}]); nothing to show hides the strip. */
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
          el("span", { class: "background-goal", text: item.goal || item.id }),
          el("span", { class: "background-elapsed", dataset: { field: "elapsed" } }),
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
