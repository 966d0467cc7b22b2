// The session sidebar: every session of the store, newest activity first, with its source,
// an unread mark and a busy spinner. Titles are text.
import { el, relativeTime, sourceLabel } from "/static/dom.js";

export function sessionTitle(session) {
  const title = session && typeof session.title === "string" ? session.title.trim() : "";
  return title || "New chat";
}

export class Sidebar {
  constructor(listNode, { onOpen }) {
    this.list = listNode;
    this.onOpen = onOpen;
    this.nodes = new Map();
  }

  /** Render `sessions` (already ordered); `currentId` is marked aria-current. */
  render(sessions, currentId) {
    const seen = new Set();
    let previous = null;
    for (const session of sessions) {
      seen.add(session.id);
      let node = this.nodes.get(session.id);
      if (!node) {
        node = this.create(session.id);
        this.nodes.set(session.id, node);
      }
      this.fill(node, session, currentId);
      const expected = previous ? previous.nextSibling : this.list.firstChild;
      if (expected !== node) this.list.insertBefore(node, expected);
      previous = node;
    }
    for (const [id, node] of this.nodes) {
      if (!seen.has(id)) {
        node.remove();
        this.nodes.delete(id);
      }
    }
    if (!sessions.length) {
      if (!this.list.querySelector(".empty-line")) {
        this.list.append(el("p", { class: "empty-line", text: "No sessions yet." }));
      }
    } else {
      this.list.querySelector(".empty-line")?.remove();
    }
  }

  create(id) {
    const node = el(
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
    return node;
  }

  fill(node, session, currentId) {
    const title = sessionTitle(session);
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
    if (session.id === currentId) node.setAttribute("aria-current", "page");
    else node.removeAttribute("aria-current");
    const label = [title, sourceLabel(session.source)];
    if (session.unread) label.push("unread");
    if (session.busy) label.push("working");
    node.setAttribute("aria-label", label.join(", "));
  }
}
