// The session sidebar: every session of the store, newest activity first, with its source,
// an unread mark and a busy spinner. A web UI session can be renamed (in place) and deleted
// (after an in-place confirm, never a browser dialog); the others are read-only. Titles are text.
import { el, relativeTime, sourceLabel } from "/static/dom.js";

export function sessionTitle(session) {
  const title = session && typeof session.title === "string" ? session.title.trim() : "";
  return title || "New chat";
}

export class Sidebar {
  /** onOpen(id); onRename(id, title) → Promise<bool>; onDelete(id) → Promise<bool>. */
  constructor(listNode, { onOpen, onRename, onDelete }) {
    this.list = listNode;
    this.onOpen = onOpen;
    this.onRename = onRename;
    this.onDelete = onDelete;
    this.rows = new Map(); // id → the row: the session's link and its actions
  }

  /** Render `sessions` (already ordered); `currentId` is marked aria-current. */
  render(sessions, currentId, emptyText = "No sessions here.") {
    const seen = new Set();
    let previous = null;
    for (const session of sessions) {
      seen.add(session.id);
      let row = this.rows.get(session.id);
      if (!row) {
        row = this.create(session.id);
        this.rows.set(session.id, row);
      }
      this.fill(row, session, currentId);
      const expected = previous ? previous.nextSibling : this.list.firstChild;
      if (expected !== row) this.list.insertBefore(row, expected);
      previous = row;
    }
    for (const [id, row] of this.rows) {
      if (!seen.has(id)) {
        row.remove();
        this.rows.delete(id);
      }
    }
    if (!sessions.length) {
      const empty = this.list.querySelector(".empty-line") || this.list.appendChild(el("p", { class: "empty-line" }));
      empty.textContent = emptyText;
    } else {
      this.list.querySelector(".empty-line")?.remove();
    }
  }

  create(id) {
    const link = el(
      "a",
      {
        class: "session-item",
        href: `/?session=${encodeURIComponent(id)}`,
        dataset: { testid: "session-item", sessionId: id },
        on: {
          click: (event) => {
            if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
            event.preventDefault();
            this.onOpen(id);
          },
        },
      },
      el("span", { class: "session-title" }),
      el(
        "span",
        { class: "session-meta" },
        el("span", { class: "badge source" }),
        el("span", { class: "session-time" }),
        el("span", { class: "spinner", "aria-hidden": "true" }),
      ),
      el("span", { class: "unread-dot", "aria-hidden": "true" }),
    );
    const actions = el(
      "div",
      { class: "session-actions" },
      el("button", {
        type: "button",
        class: "session-menu",
        "aria-label": "Rename or delete",
        "aria-expanded": "false",
        dataset: { testid: "session-menu" },
        text: "⋯",
        on: { click: () => this.toggleMenu(row, id) },
      }),
    );
    const row = el("div", { class: "session-row", dataset: { sessionId: id } }, link, actions);
    return row;
  }

  fill(row, session, currentId) {
    const node = row.querySelector(".session-item");
    const title = sessionTitle(session);
    row.dataset.title = title;
    node.querySelector(".session-title").textContent = title;
    const badge = node.querySelector(".source");
    badge.textContent = sourceLabel(session.source);
    badge.dataset.source = session.source || "";
    node.querySelector(".session-time").textContent = relativeTime(
      session.updated_at || session.created_at,
    );
    node.dataset.unread = session.unread ? "true" : "false";
    node.dataset.busy = session.busy ? "true" : "false";
    node.dataset.chat = session.chat ? "true" : "false";
    row.querySelector(".session-actions").hidden = !session.chat;
    if (session.id === currentId) node.setAttribute("aria-current", "page");
    else node.removeAttribute("aria-current");
    const label = [title, sourceLabel(session.source)];
    if (session.unread) label.push("unread");
    if (session.busy) label.push("working");
    node.setAttribute("aria-label", label.join(", "));
  }

  /** The row's menu: Rename and Delete, below the session's link. */
  toggleMenu(row, id) {
    const button = row.querySelector(".session-menu");
    const open = row.querySelector(".session-menu-panel");
    button.setAttribute("aria-expanded", String(!open));
    if (open) {
      open.remove();
      return;
    }
    const close = () => {
      panel.remove();
      button.setAttribute("aria-expanded", "false");
    };
    const panel = el(
      "div",
      { class: "session-menu-panel" },
      el("button", {
        type: "button",
        class: "btn btn-small",
        dataset: { testid: "rename-session" },
        text: "Rename",
        on: {
          click: () => {
            close();
            this.startRename(row, id);
          },
        },
      }),
      el("button", {
        type: "button",
        class: "btn btn-small btn-danger-outline",
        dataset: { testid: "delete-session" },
        text: "Delete",
        on: {
          click: () => {
            close();
            this.askDelete(row, id);
          },
        },
      }),
    );
    row.append(panel);
  }

  /** The title becomes a text field: Enter (or leaving it) saves, Escape keeps the old one. */
  startRename(row, id) {
    if (row.querySelector(".rename-input")) return;
    const link = row.querySelector(".session-item");
    const input = el("input", {
      type: "text",
      class: "rename-input",
      maxlength: "200",
      "aria-label": "New title",
      dataset: { testid: "rename-input" },
    });
    input.value = row.dataset.title || "";
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== row.dataset.title) {
        input.disabled = true;
        await this.onRename(id, title);
      }
      input.remove();
      link.hidden = false;
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        finish(true);
      } else if (event.key === "Escape") {
        event.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    link.hidden = true;
    row.prepend(input);
    input.focus();
    input.select();
  }

  /** Delete asks once more, in the row itself. */
  askDelete(row, id) {
    if (row.querySelector(".confirm-delete")) return;
    const confirm = el(
      "div",
      { class: "confirm-delete", role: "group", "aria-label": "Confirm delete" },
      el("span", { text: "Delete this chat?" }),
      el("button", {
        type: "button",
        class: "btn btn-small btn-danger",
        dataset: { testid: "confirm-delete" },
        text: "Delete",
        on: {
          click: async (event) => {
            event.currentTarget.disabled = true;
            if (!(await this.onDelete(id))) confirm.remove();
          },
        },
      }),
      el("button", {
        type: "button",
        class: "btn btn-small",
        dataset: { testid: "cancel-delete" },
        text: "Cancel",
        on: { click: () => confirm.remove() },
      }),
    );
    row.append(confirm);
    confirm.querySelector("[data-testid=cancel-delete]").focus();
  }
}
