// The chat's schedule panel: the session's recurring schedules, each with its note, how often
// it fires and when it fires next (in the schedule's own zone, as the server gives it), and a
// ✕ that cancels it. The list comes from the server (`GET /api/schedules?session=`); it is
// asked again when the session opens, after each turn and after each wake-up.

import { clear, el } from "/static/dom.js";

export class SchedulePanel {
  /** `load(id)` fetches the session's schedules; `onCancel(id)` cancels one (a promise). */
  constructor(root, { load = null, onCancel = null } = {}) {
    this.root = root;
    this.loadFn = load;
    this.onCancel = onCancel;
    this.items = [];
    this.sessionId = null;
  }

  async refresh(sessionId) {
    this.sessionId = sessionId;
    if (!this.loadFn || !sessionId) return this.show([]);
    try {
      const { schedules } = await this.loadFn(sessionId);
      if (this.sessionId === sessionId) this.show(schedules);
    } catch {
      // A courtesy: the next turn or wake-up asks again.
    }
  }

  clear() {
    this.sessionId = null;
    this.show([]);
  }

  show(items) {
    this.items = Array.isArray(items) ? items : [];
    clear(this.root);
    this.root.hidden = this.items.length === 0;
    for (const item of this.items) {
      const how = item.cron ? `${item.cron} (${item.tz})` : `every ${item.every_seconds} s`;
      const next = item.state === "paused" ? "paused" : `next ${item.next_due_at || "—"}`;
      this.root.append(
        el(
          "div",
          {
            class: "schedule-item",
            dataset: { testid: "schedule-item", id: item.id, state: item.state },
          },
          el("span", { class: "schedule-label", text: "Scheduled:" }),
          el("span", { class: "schedule-note", text: item.note }),
          el("span", { class: "schedule-how", text: how }),
          el("span", { class: "schedule-next", dataset: { testid: "schedule-next" }, text: next }),
          this.cancelButton(item),
        ),
      );
    }
  }

  cancelButton(item) {
    const button = el("button", {
      type: "button",
      class: "icon-btn schedule-cancel",
      text: "✕",
      title: "Cancel this schedule",
      "aria-label": `Cancel this schedule: ${item.note}`,
      dataset: { testid: "schedule-cancel" },
    });
    button.hidden = !this.onCancel;
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await this.onCancel(item.id);
        this.show(this.items.filter((s) => s.id !== item.id));
      } catch {
        button.disabled = false;
      }
    });
    return button;
  }
}
