// The Deliveries page: the ledger's rows (pending / delivered / dropped), attempts, last
// error, filters, redeliver and drop; rows change live from the tab's event stream.
import { api } from "/static/api.js";
import { el, relativeTime } from "/static/dom.js";
import { failure, notice } from "/static/toasts.js";

export class DeliveriesView {
  constructor(root, emptyNode, { sessionTitle, onOpenSession }) {
    this.root = root;
    this.empty = emptyNode;
    this.sessionTitle = sessionTitle;
    this.onOpenSession = onOpenSession;
    this.filter = { state: "", q: "" };
    this.rows = new Map();
    this.seq = 0;
  }

  async load() {
    const seq = ++this.seq;
    const data = await api.deliveries(this.filter);
    if (seq !== this.seq) return;
    this.showNotice(data.notice);
    this.rows.clear();
    this.root.replaceChildren();
    for (const delivery of data.deliveries || []) this.upsert(delivery, { append: true });
    this.updateEmpty();
  }

  // The server's word on what this page leaves out (a web UI without a password, beside an
  // API with a key, shows only its own sessions' work). Text only, above the list.
  showNotice(text) {
    if (!this.noticeNode) {
      this.noticeNode = el("p", { class: "empty-line", role: "note", "data-testid": "deliveries-notice" });
      this.root.before(this.noticeNode);
    }
    this.noticeNode.textContent = text || "";
    this.noticeNode.hidden = !text;
  }

  matches(delivery) {
    if (this.filter.state && delivery.state !== this.filter.state) return false;
    if (this.filter.q) {
      const q = this.filter.q.toLowerCase();
      const haystack = [delivery.id, delivery.kind, delivery.summary, delivery.last_error, delivery.session_id]
        .map((v) => String(v ?? "").toLowerCase())
        .join(" ");
      if (!haystack.includes(q)) return false;
    }
    return true;
  }

  upsert(delivery, { append = false } = {}) {
    const existing = this.rows.get(delivery.id);
    if (!this.matches(delivery)) {
      if (existing) {
        existing.remove();
        this.rows.delete(delivery.id);
        this.updateEmpty();
      }
      return;
    }
    const node = this.row(delivery);
    if (existing) existing.replaceWith(node);
    else if (append) this.root.append(node);
    else this.root.prepend(node);
    this.rows.set(delivery.id, node);
    this.updateEmpty();
  }

  updateEmpty() {
    this.empty.hidden = this.rows.size > 0;
  }

  row(d) {
    const state = String(d.state || "");
    const attempts = d.max_attempts ? `${d.attempts ?? 0} / ${d.max_attempts}` : String(d.attempts ?? 0);
    const session = d.session_id
      ? el("a", {
          href: `/?session=${encodeURIComponent(d.session_id)}`,
          class: "delivery-session",
          text: this.sessionTitle(d.session_id),
          on: {
            click: (event) => {
              event.preventDefault();
              this.onOpenSession(d.session_id);
            },
          },
        })
      : el("span", { class: "muted", text: "no session" });
    return el(
      "div",
      {
        class: `delivery-row state-${state}`,
        role: "listitem",
        dataset: { testid: "delivery-row", deliveryState: state, deliveryId: d.id },
      },
      el(
        "div",
        { class: "delivery-main" },
        el("span", { class: `pill state ${state}`, text: state }),
        el("span", { class: "delivery-kind", text: String(d.kind ?? "") }),
        el("span", { class: "delivery-summary", text: String(d.summary ?? d.id ?? "") }),
      ),
      el(
        "div",
        { class: "delivery-meta" },
        el("span", { class: "delivery-attempts", dataset: { field: "attempts" }, text: `Attempts ${attempts}` }),
        d.work_state ? el("span", { dataset: { field: "work-state" }, text: `Work ${d.work_state}` }) : null,
        session,
        el("span", { class: "muted", title: String(d.updated_at ?? ""), text: relativeTime(d.updated_at || d.created_at) }),
        el("code", { class: "delivery-id", text: String(d.id ?? "") }),
      ),
      d.last_error ? el("p", { class: "delivery-error", dataset: { field: "last-error" }, text: String(d.last_error) }) : null,
      el(
        "div",
        { class: "delivery-actions" },
        el("button", {
          type: "button",
          class: "btn btn-small",
          dataset: { testid: "redeliver" },
          disabled: state !== "dropped",
          title: "Put a dropped row back to pending, with a fresh budget",
          text: "Redeliver",
          on: { click: (e) => this.act(d, "redeliver", e.currentTarget) },
        }),
        el("button", {
          type: "button",
          class: "btn btn-small btn-danger-outline",
          dataset: { testid: "drop" },
          disabled: state !== "pending",
          title: "Stop delivering this row (its result is kept)",
          text: "Drop",
          on: { click: (e) => this.act(d, "drop", e.currentTarget) },
        }),
      ),
    );
  }

  async act(delivery, action, button) {
    button.disabled = true;
    const before = this.rows.get(delivery.id);
    try {
      const data = action === "drop" ? await api.drop(delivery.id) : await api.redeliver(delivery.id);
      // The event stream may already have brought a newer state (a redelivered row can be
      // delivered before this answer arrives): the answer only counts if nothing came since.
      if (data && data.delivery && this.rows.get(delivery.id) === before) this.upsert(data.delivery);
      notice(action === "drop" ? "Delivery dropped" : "Delivery queued again", "info");
    } catch (err) {
      button.disabled = false;
      failure(err, `Could not ${action}`);
    }
  }
}
