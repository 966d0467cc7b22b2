// The transcript of the session in view: messages, tool steps, wake-up cards, approval cards,
// and the live stream of a running turn. Only the agent's replies go through the markdown
// sanitizer; everything else is text.
import { compareIds, el, formatDuration, toDate } from "/static/dom.js";
import { setMarkdown } from "/static/markdown.js";

const OK = new Set(["done", "completed", "complete", "success", "succeeded", "ok", "finished"]);
// What a settled approval card says; "expired" is not a denial: nobody answered in time.
const OUTCOMES = {
  approved: "Approved",
  denied: "Denied",
  expired: "Expired: nobody answered in time, so it did not run",
};
const BAD = new Set(["failed", "error", "errored", "timeout", "timed_out", "cancelled", "killed", "lost", "stalled"]);

export function statusTone(status) {
  const s = String(status || "").toLowerCase();
  if (OK.has(s)) return "ok";
  if (BAD.has(s)) return "err";
  return "neutral";
}

/** The compact, expandable card of a completion that came home. Every field is text. A
 * combined wake-up (several results in one turn) is one card listing each result's card. */
export function wakeupCard(card) {
  if (card.work_kind === "combined" && Array.isArray(card.results) && card.results.length) {
    return combinedCard(card);
  }
  return resultCard(card, "wakeup-card");
}

function combinedCard(card) {
  const status = String(card.status ?? "");
  const results = card.results;
  return el(
    "article",
    {
      class: `wakeup-card wakeup-combined tone-${statusTone(status)}`,
      dataset: { testid: "wakeup-card", status, deliveryId: card.delivery_id, workKind: "combined", count: String(results.length) },
      "aria-label": `${results.length} background results`,
    },
    el(
      "div",
      { class: "wakeup-head" },
      el("span", { class: "wakeup-icon", "aria-hidden": "true" }),
      el("span", { class: "wakeup-kind", text: `${results.length} background results` }),
      el("span", { class: `pill ${statusTone(status)}`, dataset: { field: "status" }, text: status || "unknown" }),
    ),
    el(
      "ol",
      { class: "wakeup-results" },
      results.map((result) => el("li", {}, resultCard(result, "wakeup-result"))),
    ),
  );
}

function resultCard(card, testid) {
  const status = String(card.status ?? "");
  const isProcess = card.work_kind === "process";
  const duration = formatDuration(card.duration_seconds);
  const result = String(card.result ?? "");
  const hasExit = card.exit_code !== undefined && card.exit_code !== null;

  const head = el(
    "div",
    { class: "wakeup-head" },
    el("span", { class: "wakeup-icon", "aria-hidden": "true" }),
    el("span", {
      class: "wakeup-kind",
      text: isProcess ? "Process finished" : card.work_kind === "scheduled_wakeup" ? "Scheduled wake-up" : "Background task finished",
    }),
    el("span", { class: `pill ${statusTone(status)}`, dataset: { field: "status" }, text: status || "unknown" }),
    duration ? el("span", { class: "wakeup-duration", dataset: { field: "duration" }, text: duration }) : null,
  );
  const goal = el("p", { class: "wakeup-goal", dataset: { field: "goal" }, text: String(card.goal ?? "") });
  const command =
    isProcess && card.command
      ? el(
          "p",
          { class: "wakeup-command" },
          el("code", { dataset: { field: "command" }, text: String(card.command) }),
          hasExit
            ? el("span", {
                class: `pill ${Number(card.exit_code) === 0 ? "ok" : "err"}`,
                dataset: { field: "exit-code" },
                text: `exit ${card.exit_code}`,
              })
            : null,
        )
      : null;
  const preview = el("p", { class: "wakeup-result", dataset: { field: "result" }, text: result || "(no output)" });
  const details = el(
    "details",
    { class: "wakeup-details" },
    el("summary", { text: "Details" }),
    el(
      "dl",
      {},
      el("dt", { text: "Result" }),
      el("dd", {}, el("pre", { text: result || "(no output)" })),
      isProcess && card.command ? [el("dt", { text: "Command" }), el("dd", {}, el("pre", { text: String(card.command) }))] : null,
      hasExit ? [el("dt", { text: "Exit code" }), el("dd", { text: String(card.exit_code) })] : null,
      duration ? [el("dt", { text: "Duration" }), el("dd", { text: duration })] : null,
      card.delivery_id ? [el("dt", { text: "Delivery" }), el("dd", {}, el("code", { text: String(card.delivery_id) }))] : null,
    ),
  );
  return el(
    "article",
    {
      class: `wakeup-card tone-${statusTone(status)}`,
      dataset: { testid, status, deliveryId: card.delivery_id, workKind: card.work_kind },
      "aria-label": `${isProcess ? "Process" : "Background task"} ${status}`,
    },
    head,
    goal,
    command,
    preview,
    details,
  );
}

/** A delivery row that is not a background result (an approval's answer, an expired
 * approval, a scheduled wake-up, or a kind this page does not know): its heading, the
 * command it names, and its text. Every field is text. */
export function deliveryCard(item) {
  const kind = String(item.display_kind || "");
  return el(
    "article",
    { class: "delivery-card", dataset: { testid: "delivery-card", displayKind: kind, messageId: item.id } },
    el(
      "div",
      { class: "wakeup-head" },
      el("span", { class: "delivery-icon", "aria-hidden": "true" }),
      el("span", { class: "wakeup-kind", dataset: { field: "title" }, text: String(item.title || kind || "Delivery") }),
      item.status ? el("span", { class: `pill ${statusTone(item.status)}`, dataset: { field: "status" }, text: String(item.status) }) : null,
      stamp(item.created_at),
    ),
    item.command
      ? el("p", { class: "wakeup-command" }, el("code", { dataset: { field: "command" }, text: String(item.command) }))
      : null,
    el("div", { class: "delivery-text", dataset: { field: "text" }, text: String(item.text ?? "") }),
  );
}

/** A message's time: short on the page, in full as its tooltip. */
function stamp(value) {
  const date = toDate(value);
  if (!date) return null;
  const sameDay = date.toDateString() === new Date().toDateString();
  const short = sameDay
    ? date.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  // Drawn from data-label (CSS), not text: a message's text stays exactly what was written.
  return el("time", {
    class: "stamp",
    datetime: date.toISOString(),
    title: date.toLocaleString(),
    dataset: { testid: "timestamp", label: short },
  });
}

/** A small action under a message; its label is drawn from data-label (see `stamp`). */
export function metaButton(label, testid, ariaLabel, onClick) {
  return el("button", {
    type: "button",
    class: "meta-btn",
    "aria-label": ariaLabel,
    title: ariaLabel,
    dataset: { testid, label },
    on: { click: onClick },
  });
}

/** Put `text` on the clipboard (the Clipboard API, or the old copy command where it is missing). */
export async function copyText(text) {
  if (navigator.clipboard?.writeText) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // not allowed here: try the old way
    }
  }
  const area = el("textarea", { class: "sr-only", "aria-hidden": "true" });
  area.value = text;
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  return ok;
}

function toolStep({ name, status, summary }) {
  const node = el(
    "div",
    { class: "tool-step", dataset: { testid: "tool-step", status: status || "" } },
    el("span", { class: "tool-icon", "aria-hidden": "true" }),
    el("code", { class: "tool-name" }),
    el("span", { class: "tool-summary" }),
  );
  updateToolStep(node, { name, status, summary });
  return node;
}

function updateToolStep(node, { name, status, summary }) {
  node.dataset.status = status || "";
  node.dataset.name = name || "";
  node.classList.toggle("running", isRunning(status));
  node.querySelector(".tool-name").textContent = String(name || "tool");
  node.querySelector(".tool-summary").textContent = String(summary || status || "");
}

function isRunning(status) {
  return ["running", "started", "start", "pending", "in_progress", "waiting"].includes(
    String(status || "").toLowerCase(),
  );
}

export class ChatView {
  constructor(root, { onDecide, onOlder, onRetry, onRevise }) {
    this.root = root;
    this.onDecide = onDecide;
    // (how: "edit" | "regenerate", messageId: "m12" | "last", text) → Promise<bool>
    this.onRevise = onRevise;
    this.revisable = false; // whether the last turn may be edited or answered again now
    this.onRetry = onRetry; // (text, node) → Promise<bool>: send a failed message again
    this.onOlder = onOlder;
    this.older = null; // the cursor of the transcript's page before the first one shown
    this.fetchingOlder = false;
    // A long transcript comes a page at a time: scrolling near its top fetches the one before.
    root.addEventListener("scroll", () => {
      if (root.scrollTop < 200) this.loadOlder();
    });
    this.sessionId = null;
    this.lastEventId = "";
    this.loading = false;
    this.buffer = [];
    this.streams = new Map(); // stream_id → {node, body, text, frame}
    this.cards = new Set(); // delivery ids shown
    this.approvals = new Map();
    this.pendingUser = []; // optimistic user messages awaiting their turn.start
    this.activeStreamId = null;
  }

  /** Forget the shown session; events for `sessionId` are buffered until `load`. */
  begin(sessionId) {
    this.sessionId = sessionId;
    this.loading = true;
    this.buffer = [];
    this.lastEventId = "";
    this.reset();
  }

  /** Like `begin`, but what is shown stays until `load` replaces it. */
  beginQuiet(sessionId) {
    this.sessionId = sessionId;
    this.loading = true;
    this.buffer = [];
  }

  reset() {
    for (const stream of this.streams.values()) cancelAnimationFrame(stream.frame);
    this.streams.clear();
    this.cards.clear();
    this.approvals.clear();
    this.pendingUser = [];
    this.activeStreamId = null;
    this.root.replaceChildren();
  }

  /** Render a session's detail (`GET /api/sessions/{id}`), then the events that came meanwhile. */
  load(detail) {
    this.reset();
    this.lastEventId = String(detail.last_event_id ?? "");
    this.older = detail.older || null;
    this.fetchingOlder = false;
    if (this.older) this.root.append(this.olderButton());
    for (const item of detail.items || []) this.renderItem(item);
    const active = detail.active_stream;
    if (active && active.stream_id) {
      let question = null;
      if (typeof active.user_text === "string" && active.user_text && !active.wakeup) {
        question = this.message("user", active.user_text);
        this.root.append(question);
      }
      const stream = this.startStream(active.stream_id, {
        wakeup: Boolean(active.wakeup),
        text: active.text || "",
      });
      stream.question = question;
      // An older server's active stream lacks user_text / wakeup: refetch once it ends, so
      // the question and the wake-up mark come from the stored transcript (so do images).
      stream.refetchAtEnd = !("user_text" in active) || !("wakeup" in active);
      stream.imagesAtEnd = Number(active.images) > 0;
      if (active.last_event_id && compareIds(active.last_event_id, this.lastEventId) > 0) {
        this.lastEventId = String(active.last_event_id);
      }
    }
    if (detail.pending_approval) this.upsertApproval(detail.pending_approval);
    // Background work's approvals wait without holding the session: shown whenever the tab opens.
    for (const approval of detail.unit_approvals || []) this.upsertApproval(approval);
    this.loading = false;
    const buffered = this.buffer;
    this.buffer = [];
    for (const [type, data, id] of buffered) this.handle(type, data, id);
    this.scrollToEnd(true);
  }

  isEmpty() {
    return !this.root.firstChild;
  }

  olderButton() {
    const button = el("button", {
      type: "button",
      class: "load-older",
      dataset: { testid: "load-older" },
      text: "Show earlier messages",
    });
    button.addEventListener("click", () => this.loadOlder());
    return button;
  }

  /** The transcript's page before the first one shown, put above it; the view stays put. */
  async loadOlder() {
    if (!this.older || this.fetchingOlder || this.loading || !this.onOlder) return;
    const sessionId = this.sessionId;
    this.fetchingOlder = true;
    let page;
    try {
      page = await this.onOlder(sessionId, this.older);
    } catch {
      this.fetchingOlder = false;
      return;
    }
    if (sessionId !== this.sessionId || this.loading) return;
    const fragment = document.createDocumentFragment();
    this.older = page.older || null;
    if (this.older) fragment.append(this.olderButton());
    for (const item of page.items || []) this.renderItem(item, fragment);
    const before = this.root.scrollHeight - this.root.scrollTop;
    this.root.querySelector(".load-older")?.remove();
    this.root.prepend(fragment);
    this.root.scrollTop = this.root.scrollHeight - before;
    this.fetchingOlder = false;
  }

  /** Show the message `messageId` (fetching earlier pages until it is there), marked. */
  async focusMessage(messageId) {
    const sessionId = this.sessionId;
    const find = () => this.root.querySelector(`[data-message-id="${CSS.escape(messageId)}"]`);
    for (let page = 0; !find() && this.older && page < 50; page += 1) {
      await this.loadOlder();
      if (sessionId !== this.sessionId) return false;
    }
    const node = find();
    if (!node) return false;
    for (const old of this.root.querySelectorAll(".found")) old.classList.remove("found");
    node.classList.add("found");
    node.dataset.found = "true";
    node.scrollIntoView({ block: "center" });
    return true;
  }

  renderItem(item, target = this.root) {
    if (item.kind === "message") {
      const node = this.message(item.role, item.content, {
        wakeup: item.wakeup,
        id: item.id,
        createdAt: item.created_at,
        images: item.images,
        edited: item.superseded ? "earlier version" : item.edited,
      });
      if (item.superseded) node.dataset.superseded = "true";
      if (item.stopped) {
        node.dataset.status = "stopped";
        node.append(el("p", { class: "message-note", text: "Stopped" }));
      }
      if (item.failed) this.markFailed(node, item.content, item.error);
      if (item.archived) {
        node.dataset.archived = "true";
        node.title = "Summarised for the model (compaction); kept here as written";
      }
      target.append(node);
    } else if (item.kind === "summary") {
      // Where a compaction happened: the messages above it reach the model as its summary.
      const count = Number(item.messages) || 0;
      const done = Array.isArray(item.deliveries) ? item.deliveries.length : 0;
      const text =
        `Earlier messages (${count}) were summarised for the model` +
        (done ? `, including ${done} finished background result(s)` : "") +
        "; they are still shown here.";
      target.append(
        el("p", { class: "compaction-marker", dataset: { testid: "compaction", messageId: item.id }, text }),
      );
    } else if (item.kind === "wakeup" && item.card) {
      this.addCard(item.card, target);
    } else if (item.kind === "approval" && item.approval) {
      // A background task's approval settled for good (it expired): where it happened.
      const node = this.approvalCard(item.approval);
      this.approvals.get(item.approval.id)?.remove();
      this.approvals.set(item.approval.id, node);
      target.append(node);
    } else if (item.kind === "delivery") {
      target.append(deliveryCard(item));
    } else if (item.kind === "tool") {
      target.append(toolStep(item));
    }
  }

  message(role, content, { wakeup = false, id = null, streaming = false, createdAt = null, images = null, edited = null } = {}) {
    const body = el("div", { class: "message-body" });
    const node = el(
      "div",
      {
        class: `message ${role}${wakeup ? " wakeup-reply" : ""}${streaming ? " streaming" : ""}`,
        dataset: { testid: "message", role, messageId: id, wakeup: wakeup ? "true" : null, edited: edited || null },
      },
      role === "assistant" ? el("span", { class: "avatar", "aria-hidden": "true" }) : null,
      body,
    );
    if (role === "assistant") setMarkdown(body, content || "");
    else body.textContent = String(content ?? "");
    if (Array.isArray(images) && images.length) node.append(thumbnails(images));
    node.rawText = String(content ?? "");
    node.append(this.messageMeta(node, createdAt ?? Date.now() / 1000, edited));
    return node;
  }

  /** Below a message: when it was written, Copy, and (set by `markLast`) Edit or Regenerate. */
  messageMeta(node, createdAt, edited) {
    const copy = metaButton("Copy", "copy-message", "Copy this message", async () => {
      const ok = await copyText(node.rawText || "");
      copy.dataset.label = ok ? "Copied" : "Copy failed";
      setTimeout(() => (copy.dataset.label = "Copy"), 1500);
    });
    return el(
      "div",
      { class: "message-meta" },
      stamp(createdAt),
      edited ? el("span", { class: "edited-mark", dataset: { label: String(edited) } }) : null,
      copy,
    );
  }

  /** Edit (the last message) and Regenerate (its reply) only on the last turn, while the
   * session is free; `allowed` says whether it is. */
  setRevisable(allowed) {
    this.revisable = allowed;
    for (const button of this.root.querySelectorAll(".meta-btn.revise")) button.remove();
    if (!allowed || this.root.querySelector(".edit-form")) return;
    const live = (n) => n.dataset.superseded !== "true" && !n.classList.contains("pending") && !n.classList.contains("streaming");
    const users = [...this.root.querySelectorAll(".message.user")].filter(live);
    const question = users.at(-1);
    if (!question || question.dataset.wakeup === "true") return;
    question.querySelector(".message-meta")?.append(
      metaButton("Edit", "edit-message", "Edit this message and send it again", () => this.startEdit(question)),
    );
    let reply = null;
    for (let n = question.nextElementSibling; n; n = n.nextElementSibling) {
      if (n.matches(".message.assistant") && live(n)) reply = n;
    }
    reply?.querySelector(".message-meta")?.append(
      metaButton("Regenerate", "regenerate", "Answer the last message again", () => this.regenerate(question, reply)),
    );
    for (const button of this.root.querySelectorAll("[data-testid=edit-message], [data-testid=regenerate]")) {
      button.classList.add("revise");
    }
  }

  /** The nodes of the turn that starts at `question`: it and the replies after it. */
  turnNodes(question) {
    const nodes = [question];
    for (let n = question.nextElementSibling; n; n = n.nextElementSibling) {
      if (n.matches(".message.assistant, .tool-step")) nodes.push(n);
    }
    return nodes;
  }

  supersede(nodes) {
    for (const node of nodes) {
      node.dataset.superseded = "true";
      const meta = node.querySelector(".message-meta");
      if (meta && !meta.querySelector(".edited-mark")) {
        meta.insertBefore(el("span", { class: "edited-mark", dataset: { label: "earlier version" } }), meta.children[1] || null);
      }
    }
  }

  /** The last message becomes a text field; "Save & send" replaces the turn with a new one. */
  startEdit(question) {
    const body = question.querySelector(".message-body");
    const input = el("textarea", { class: "edit-input", rows: "3", "aria-label": "Edited message", dataset: { testid: "edit-input" } });
    input.value = question.rawText || "";
    const form = el(
      "form",
      { class: "edit-form" },
      input,
      el(
        "div",
        { class: "edit-actions" },
        el("button", { type: "button", class: "btn btn-small", dataset: { testid: "cancel-edit" }, text: "Cancel", on: { click: () => close() } }),
        el("button", { type: "submit", class: "btn btn-small btn-primary", dataset: { testid: "save-edit" }, text: "Save & send" }),
      ),
    );
    const close = () => {
      form.remove();
      body.hidden = false;
      this.setRevisable(this.revisable);
    };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = input.value;
      if (!text.trim()) return;
      form.querySelector("[type=submit]").disabled = true;
      const nodes = this.turnNodes(question);
      if (await this.onRevise("edit", question.dataset.messageId || "last", text)) {
        form.remove();
        body.hidden = false;
        this.supersede(nodes);
      } else {
        form.querySelector("[type=submit]").disabled = false;
      }
    });
    // As in the composer: Enter sends, Shift+Enter starts a new line; Escape keeps the old text.
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.stopPropagation();
        close();
      } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    body.hidden = true;
    body.after(form);
    for (const button of this.root.querySelectorAll(".meta-btn.revise")) button.remove();
    input.focus();
  }

  async regenerate(question, reply) {
    const nodes = this.turnNodes(question);
    if (await this.onRevise("regenerate", question.dataset.messageId || "last", "")) {
      // Asked again as it was: the new turn shows the same question; the old reply stays.
      question.remove();
      this.supersede(nodes.filter((n) => n !== question));
    }
    return reply;
  }

  /** An optimistic user message, shown at once and confirmed by its turn.start. */
  addPendingUser(text, images = []) {
    const node = this.message("user", text, { images });
    node.classList.add("pending");
    this.root.append(node);
    this.pendingUser.push({ text, node });
    this.scrollToEnd(true);
    return node;
  }

  dropPendingUser(node) {
    this.pendingUser = this.pendingUser.filter((p) => p.node !== node);
    node.remove();
  }

  /** A user's message whose turn failed: the error and a Retry that sends it again. */
  markFailed(node, text, error) {
    node.classList.add("failed");
    node.dataset.status = "failed";
    node.querySelector(".failed-note")?.remove();
    const retry = el("button", {
      type: "button",
      class: "btn btn-small",
      dataset: { testid: "retry" },
      text: "Retry",
      on: {
        click: async () => {
          retry.disabled = true;
          if (!(await this.onRetry(String(text ?? ""), node))) retry.disabled = false;
        },
      },
    });
    node.append(
      el(
        "p",
        { class: "failed-note", dataset: { testid: "failed-note" } },
        el("span", { text: `Not answered: ${error || "the turn failed"}` }),
        retry,
      ),
    );
  }

  /** A failed message sent again stands in for the failed one (the server shows it once). */
  dropFailed(text) {
    for (const node of this.root.querySelectorAll(".message.user.failed")) {
      if (node.querySelector(".message-body").textContent === text) node.remove();
    }
  }

  /** Apply one event of the tab's stream that belongs to the session in view. */
  handle(type, data, id) {
    if (this.loading) {
      this.buffer.push([type, data, id]);
      return;
    }
    if (id && this.lastEventId && compareIds(id, this.lastEventId) <= 0) return;
    if (id) this.lastEventId = String(id);
    const stick = this.nearEnd();
    switch (type) {
      case "turn.start":
        this.onTurnStart(data);
        break;
      case "turn.delta":
        this.onDelta(data);
        break;
      case "turn.tool":
        this.onTool(data);
        break;
      case "turn.end":
        this.onTurnEnd(data);
        break;
      case "wakeup":
        if (data.card) this.addCard(data.card);
        break;
      case "approval":
        if (data.approval) this.upsertApproval(data.approval);
        break;
      default:
        return;
    }
    if (stick) this.scrollToEnd();
  }

  onTurnStart(data) {
    if (this.streams.has(data.stream_id)) {
      // Loaded as the active stream already; its question may not be among the items yet.
      const stream = this.streams.get(data.stream_id);
      if (data.user_text && stream.refetchAtEnd && !data.wakeup) {
        this.root.insertBefore(this.message("user", data.user_text), stream.node);
      }
      return;
    }
    let question = null;
    if (data.user_text && !data.wakeup) {
      this.dropFailed(data.user_text);
      const index = this.pendingUser.findIndex((p) => p.text === data.user_text);
      if (index >= 0) {
        const [pending] = this.pendingUser.splice(index, 1);
        pending.node.classList.remove("pending");
        question = pending.node;
      } else {
        question = this.message("user", data.user_text);
        this.root.append(question);
      }
    }
    const stream = this.startStream(data.stream_id, { wakeup: Boolean(data.wakeup), text: "" });
    stream.question = question;
    // Another tab's question with images: they come from the stored transcript at the end.
    if (Number(data.images) > 0 && question && !question.querySelector(".thumbs")) stream.imagesAtEnd = true;
  }

  startStream(streamId, { wakeup, text }) {
    if (this.streams.has(streamId)) return this.streams.get(streamId);
    const node = this.message("assistant", text, { wakeup, streaming: true });
    node.dataset.streamId = streamId;
    node.setAttribute("aria-busy", "true"); // read out once it ends, not word by word
    const body = node.querySelector(".message-body");
    if (!text) body.append(typingDots());
    this.root.append(node);
    const stream = { node, body, text, frame: 0, done: false };
    this.streams.set(streamId, stream);
    this.activeStreamId = streamId;
    this.root.dispatchEvent(new CustomEvent("busychange"));
    return stream;
  }

  /**
   * The stream an event belongs to, or null: a turn this view never saw start ended before
   * the view loaded, so its reply is already among the stored items (not shown twice).
   */
  streamFor(data) {
    return this.streams.get(data.stream_id) || null;
  }

  onDelta(data) {
    const stream = this.streamFor(data);
    if (!stream || stream.done) return;
    stream.text += String(data.text ?? "");
    if (!stream.frame) {
      stream.frame = requestAnimationFrame(() => {
        stream.frame = 0;
        setMarkdown(stream.body, stream.text);
        if (this.nearEnd(160)) this.scrollToEnd();
      });
    }
  }

  onTool(data) {
    const stream = this.streamFor(data);
    if (!stream || stream.done) return;
    const steps = [...this.root.querySelectorAll(`.tool-step[data-stream-id="${CSS.escape(data.stream_id)}"]`)];
    const open = steps.reverse().find((n) => n.dataset.name === String(data.name || "") && n.classList.contains("running"));
    if (open) {
      updateToolStep(open, data);
      return;
    }
    const node = toolStep(data);
    node.dataset.streamId = data.stream_id;
    this.root.insertBefore(node, stream.node);
  }

  onTurnEnd(data) {
    const stream = this.streamFor(data);
    if (!stream || stream.done) return;
    cancelAnimationFrame(stream.frame);
    stream.frame = 0;
    stream.done = true;
    const content = typeof data.content === "string" ? data.content : stream.text;
    stream.text = content;
    stream.node.rawText = content;
    stream.node.classList.remove("streaming");
    stream.node.removeAttribute("aria-busy");
    stream.node.dataset.status = data.status || "done";
    if (content) setMarkdown(stream.body, content);
    else stream.body.replaceChildren();
    for (const step of this.root.querySelectorAll(`.tool-step.running[data-stream-id="${CSS.escape(data.stream_id)}"]`)) {
      step.classList.remove("running");
    }
    if (data.status === "stopped") {
      stream.node.append(el("p", { class: "message-note", text: "Stopped" }));
    } else if (data.status === "error" && stream.question) {
      // The question is kept (stored, marked failed) with the error and a Retry.
      this.markFailed(stream.question, stream.question.querySelector(".message-body").textContent, data.error);
      if (content) {
        stream.node.classList.add("error");
        stream.node.append(el("p", { class: "message-note error", text: "Interrupted" }));
      } else stream.node.remove();
    } else if (data.status === "error") {
      stream.node.classList.add("error");
      stream.node.append(el("p", { class: "message-note error", text: `Error: ${data.error || "the turn failed"}` }));
    } else if (!content) {
      stream.node.remove();
    }
    if (this.activeStreamId === data.stream_id) this.activeStreamId = null;
    this.root.dispatchEvent(new CustomEvent("busychange"));
    if (stream.refetchAtEnd || stream.imagesAtEnd) this.root.dispatchEvent(new CustomEvent("refetch"));
  }

  addCard(card, target = this.root) {
    const key = card.delivery_id ? String(card.delivery_id) : null;
    if (key && this.cards.has(key)) return;
    if (key) this.cards.add(key);
    target.append(wakeupCard(card));
  }

  upsertApproval(approval) {
    const existing = this.approvals.get(approval.id);
    const node = this.approvalCard(approval);
    if (existing) existing.replaceWith(node);
    else {
      // Before the running reply, so the question sits where the agent stopped.
      const stream = this.activeStreamId && this.streams.get(this.activeStreamId);
      if (stream && !stream.text) this.root.insertBefore(node, stream.node);
      else this.root.append(node);
    }
    this.approvals.set(approval.id, node);
  }

  approvalCard(approval) {
    const status = approval.status || "pending";
    const pending = status === "pending";
    const buttons = pending
      ? el(
          "div",
          { class: "approval-actions" },
          el("button", {
            type: "button",
            class: "btn btn-primary",
            dataset: { testid: "approve" },
            text: "Approve once",
            on: { click: (e) => this.decide(approval, "approve", e.currentTarget) },
          }),
          el("button", {
            type: "button",
            class: "btn",
            dataset: { testid: "deny" },
            text: "Deny",
            on: { click: (e) => this.decide(approval, "deny", e.currentTarget) },
          }),
        )
      : el("p", { class: `approval-outcome ${status}`, text: OUTCOMES[status] || String(status) });
    const background = Boolean(approval.unit_id);
    const title = !pending
      ? background ? "A background task's command" : "Command approval"
      : background ? "A background task wants to run a command" : "The agent wants to run a command";
    return el(
      "article",
      {
        class: `approval-card ${status}`,
        dataset: { testid: "approval-card", status, approvalId: approval.id, background: background ? "true" : null },
      },
      el("p", { class: "approval-title", text: title }),
      el("pre", { class: "approval-command" }, el("code", { text: String(approval.command ?? "") })),
      buttons,
    );
  }

  async decide(approval, decision, button) {
    const card = this.approvals.get(approval.id);
    for (const b of card?.querySelectorAll("button") || []) b.disabled = true;
    const ok = await this.onDecide(approval.id, decision);
    if (ok) this.upsertApproval({ ...approval, status: decision === "approve" ? "approved" : "denied" });
    else for (const b of card?.querySelectorAll("button") || []) b.disabled = false;
    return button;
  }

  nearEnd(slack = 80) {
    const scroller = this.root;
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < slack;
  }

  scrollToEnd(force = false) {
    if (force || this.nearEnd(400)) this.root.scrollTop = this.root.scrollHeight;
  }
}

/** Image attachments as thumbnails; only data: URLs of images are shown (the page's policy
 * allows no other source), each opens full size in place. */
export function thumbnails(images) {
  const box = el("div", { class: "thumbs", dataset: { testid: "thumbnails" } });
  for (const image of images) {
    const url = String(image?.url ?? image ?? "");
    if (!/^data:image\/(png|jpeg|gif|webp);base64,/i.test(url)) continue;
    const img = el("img", { class: "thumb", src: url, alt: String(image?.name || "image"), dataset: { testid: "thumbnail" } });
    img.addEventListener("click", () => img.classList.toggle("large"));
    box.append(img);
  }
  return box;
}

function typingDots() {
  return el("span", { class: "typing", "aria-label": "Thinking" }, el("span"), el("span"), el("span"));
}
