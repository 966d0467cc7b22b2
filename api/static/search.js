// Messages a full-text search found, under the sidebar's search box: each hit's chat, its
// source and time, and a snippet whose matched words are marked. Every piece is text.
import { el, relativeTime, sourceLabel } from "/static/dom.js";

export class SearchResults {
  /** onOpen(sessionId, messageId): open the chat at that message. */
  constructor(section, list, { onOpen }) {
    this.section = section;
    this.list = list;
    this.onOpen = onOpen;
  }

  clear() {
    this.section.hidden = true;
    this.list.replaceChildren();
  }

  show(results) {
    this.section.hidden = false;
    if (!results.length) {
      this.list.replaceChildren(el("p", { class: "search-none", text: "No messages match." }));
      return;
    }
    this.list.replaceChildren(...results.map((hit) => this.hit(hit)));
  }

  hit(hit) {
    const snippet = el("span", { class: "search-hit-snippet" });
    for (const part of Array.isArray(hit.snippet) ? hit.snippet : []) {
      const text = String(part?.text ?? "");
      snippet.append(part?.hit ? el("mark", { text }) : document.createTextNode(text));
    }
    return el(
      "button",
      {
        type: "button",
        class: "search-hit",
        role: "listitem",
        dataset: { testid: "search-hit", sessionId: hit.session_id, messageId: hit.message_id },
        on: { click: () => this.onOpen(String(hit.session_id), String(hit.message_id)) },
      },
      el(
        "span",
        { class: "search-hit-title" },
        el("span", { class: "badge source", dataset: { source: hit.source || "" }, text: sourceLabel(hit.source) }),
        " ",
        String(hit.session_title ?? ""),
      ),
      snippet,
      el("span", { class: "search-hit-meta", text: `${hit.role === "assistant" ? "Reply" : hit.role === "user" ? "Message" : "Note"} · ${relativeTime(hit.created_at)}` }),
    );
  }
}
