// Reveille's web UI: bootstrap, routing (/ and /deliveries), the tab's one event stream, and
// the glue between the sidebar, the chat, the Deliveries page and the toasts.
import { api, onLoginRequired, setCsrfToken } from "/static/api.js";
import { Attachments } from "/static/attachments.js";
import { BackgroundStrip } from "/static/background.js";
import { SchedulePanel } from "/static/schedules.js";
import { ChatView } from "/static/chat.js";
import { streamStateChanged, watchConnection } from "/static/connection.js";
import { DeliveriesView } from "/static/deliveries.js";
import { $, sourceLabel } from "/static/dom.js";
import { connect } from "/static/events.js";
import { Notifier } from "/static/notify.js";
import { SearchResults } from "/static/search.js";
import { Sidebar, sessionTitle } from "/static/sidebar.js";
import { initTheme } from "/static/theme.js";
import { completionToast, failure, notice } from "/static/toasts.js";

const state = {
  boot: null,
  sessions: new Map(),
  currentId: null,
  view: "loading",
  query: "",
  source: "", // the sidebar's source filter ("" = every source)
  started: false,
};

const app = $("#app");
const transcript = $("#transcript");
const composer = $("#composer");
const sendButton = $("#send");
const stopButton = $("#stop");
const chatEmpty = $("#chat-empty");
const composerNote = $("#composer-note");

const sidebar = new Sidebar($("#session-list"), {
  onOpen: (id) => openSession(id),
  onRename: renameSession,
  onDelete: deleteSession,
});
const chat = new ChatView(transcript, {
  onDecide: decide,
  onRetry: (text, node) => sendText(text, { retrying: node }),
  onOlder: (id, before) => api.olderItems(id, before),
  onRevise: revise,
});
const attachments = new Attachments($("#attachments"), {
  maxBytes: () => Number(state.boot?.max_image_bytes) || 700 * 1024,
});
const notifier = new Notifier($("#notify-toggle"), { onOpen: (id) => openSession(id) });
const searchResults = new SearchResults($("#search-results"), $("#search-hits"), {
  onOpen: (id, messageId) => openSession(id, { focus: messageId }),
});
const backgroundStrip = new BackgroundStrip($("#background-strip"), {
  onCancel: cancelBackground,
  onRefresh: () => state.currentId && refreshBackground(state.currentId),
});
const schedulePanel = new SchedulePanel($("#schedule-panel"), {
  load: (id) => api.schedules(id),
  onCancel: (id) => api.cancelSchedule(id),
});
const deliveries = new DeliveriesView($("#deliveries"), $("#deliveries-empty"), {
  sessionTitle: (id) => (state.sessions.has(id) ? sessionTitle(state.sessions.get(id)) : String(id)),
  onOpenSession: (id) => openSession(id),
});

// ---------------------------------------------------------------- views and routing

function showView(name) {
  state.view = name;
  app.dataset.view = name;
  for (const view of ["chat", "deliveries", "login", "loading"]) {
    $(`#view-${view}`).hidden = view !== name;
  }
  $("#nav-deliveries").toggleAttribute("aria-current", name === "deliveries");
  if (name !== "chat") backgroundStrip.clear();
  if (name !== "chat") schedulePanel.clear();
  closeSidebar();
}

function setTitle(title, badge) {
  $("#view-title").textContent = title;
  const node = $("#view-badge");
  node.hidden = !badge;
  node.textContent = badge || "";
  notifier.setTitle(title === "Reveille" ? "Reveille" : `${title} · Reveille`);
  updateChatTools();
}

/** Export and the system prompt, for the chat in view. */
function updateChatTools() {
  const session = state.view === "chat" ? currentSession() : null;
  $("#chat-tools").hidden = !session;
  if (!session) {
    closePromptPanel();
    return;
  }
  const base = `/api/sessions/${encodeURIComponent(session.id)}/export?format=`;
  $("#export-md").href = `${base}md`;
  $("#export-json").href = `${base}json`;
  $("#prompt-btn").hidden = !session.chat;
  $("#prompt-btn").classList.toggle("active", Boolean(session.system_prompt));
}

function sessionFromUrl() {
  return new URLSearchParams(location.search).get("session");
}

function navigate(url, { replace = false } = {}) {
  const target = new URL(url, location.origin);
  if (target.pathname + target.search === location.pathname + location.search) return;
  if (replace) history.replaceState(null, "", target);
  else history.pushState(null, "", target);
}

async function route() {
  if (location.pathname.replace(/\/+$/, "") === "/deliveries") {
    await showDeliveries();
    return;
  }
  const id = sessionFromUrl();
  if (id) await openSession(id, { push: false });
  else showNoSession();
}

function showNoSession() {
  state.currentId = null;
  chat.begin(null);
  chat.loading = false;
  backgroundStrip.clear();
  schedulePanel.clear();
  showView("chat");
  setTitle("New chat", "");
  renderSidebar();
  updateComposer();
}

async function showDeliveries() {
  showView("deliveries");
  setTitle("Deliveries", "");
  state.currentId = null;
  chat.begin(null);
  chat.loading = false;
  renderSidebar();
  try {
    await deliveries.load();
  } catch (err) {
    failure(err);
  }
}

// ---------------------------------------------------------------- sessions

function orderedSessions() {
  const list = [...state.sessions.values()].filter((s) => !state.source || s.source === state.source);
  list.sort((a, b) => timeOf(b.updated_at || b.created_at) - timeOf(a.updated_at || a.created_at));
  if (!state.query) return list;
  const q = state.query.toLowerCase();
  return list.filter((s) => sessionTitle(s).toLowerCase().includes(q) || String(s.id).includes(q) || s._match);
}

function timeOf(value) {
  if (typeof value === "number") return value < 1e12 ? value * 1000 : value;
  const n = Date.parse(value);
  return Number.isNaN(n) ? Number(value) || 0 : n;
}

function renderSidebar() {
  notifier.setUnread([...state.sessions.values()].filter((s) => s.unread).length);
  sidebar.render(orderedSessions(), state.currentId, state.query ? "No chat titles match." : "No sessions here.");
}

/** The messages that hold the search's words (full-text search of the store). */
async function searchMessages() {
  const query = state.query;
  if (!query) {
    searchResults.clear();
    return;
  }
  const { results } = await api.search(query);
  if (query === state.query) searchResults.show(results || []);
}

async function refreshSessions() {
  const data = await api.sessions(state.query);
  if (!state.query) state.sessions.clear();
  for (const session of data.sessions || []) {
    state.sessions.set(session.id, state.query ? { ...session, _match: true } : session);
  }
  renderSidebar();
}

function upsertSession(session) {
  const previous = state.sessions.get(session.id);
  state.sessions.set(session.id, previous?._match ? { ...session, _match: true } : session);
  if (session.id === state.currentId) {
    if (session.unread && inView(session.id)) markRead(session.id);
    setTitle(sessionTitle(session), sourceLabel(session.source));
    updateComposer();
  }
  renderSidebar();
}

function inView(sessionId) {
  return state.view === "chat" && state.currentId === sessionId && document.visibilityState === "visible";
}

function markRead(id) {
  const session = state.sessions.get(id);
  if (session) {
    session.unread = false;
    renderSidebar();
  }
  api.markRead(id).catch(() => {});
}

async function openSession(id, { push = true, quiet = false, focus = null } = {}) {
  if (id !== state.currentId) closePromptPanel();
  if (push) navigate(`/?session=${encodeURIComponent(id)}`);
  state.currentId = id;
  if (state.view !== "chat") showView("chat");
  else closeSidebar();
  const known = state.sessions.get(id);
  setTitle(known ? sessionTitle(known) : "Loading…", known ? sourceLabel(known.source) : "");
  // quiet: the same session again (a refetch); what is shown stays until the answer.
  if (quiet) chat.beginQuiet(id);
  else {
    chat.begin(id);
    backgroundStrip.clear();
    schedulePanel.clear();
  }
  chatEmpty.hidden = true;
  renderSidebar();
  updateComposer();
  let detail;
  try {
    detail = await api.session(id);
  } catch (err) {
    if (state.currentId !== id) return;
    chat.loading = false;
    if (err.status === 404) {
      notice("That session does not exist (any more).");
      navigate("/", { replace: true });
      showNoSession();
    } else {
      failure(err);
    }
    return;
  }
  if (state.currentId !== id) return;
  state.sessions.set(id, detail.session);
  setTitle(sessionTitle(detail.session), sourceLabel(detail.session.source));
  chat.load(detail);
  backgroundStrip.show(detail.background);
  backgroundStrip.setApproval(detail.pending_approval);
  schedulePanel.refresh(id);
  if (detail.session.unread && document.visibilityState === "visible") markRead(id);
  renderSidebar();
  updateComposer();
  if (focus) await chat.focusMessage(focus);
  else if (window.matchMedia("(min-width: 721px)").matches) composer.focus({ preventScroll: true });
}

/** "New chat": a draft in the page; nothing is stored until its first message is sent. */
function newSession() {
  navigate("/");
  showNoSession();
  composer.focus();
}

/** The draft's first message creates its session (untitled: named after that message). */
async function createSession() {
  try {
    const data = await api.createSession();
    state.sessions.set(data.session.id, data.session);
    await openSession(data.session.id);
    return data.session.id;
  } catch (err) {
    failure(err, "Could not create a session");
    return null;
  }
}

async function renameSession(id, title) {
  try {
    upsertSession((await api.renameSession(id, title)).session);
    return true;
  } catch (err) {
    failure(err, "Could not rename the session");
    return false;
  }
}

async function deleteSession(id) {
  try {
    await api.deleteSession(id);
  } catch (err) {
    if (err.code === "session_busy") notice("Stop the running turn (or decide its approval) first.", "info");
    else failure(err, "Could not delete the session");
    return false;
  }
  sessionDeleted(id);
  return true;
}

function sessionDeleted(id) {
  state.sessions.delete(id);
  if (state.currentId === id && state.view === "chat") newSession();
  else renderSidebar();
}

// ---------------------------------------------------------------- the chat's system prompt

function openPromptPanel() {
  const session = currentSession();
  if (!session?.chat) return;
  $("#prompt-text").value = session.system_prompt || "";
  $("#prompt-panel").hidden = false;
  $("#prompt-btn").setAttribute("aria-expanded", "true");
  $("#prompt-text").focus();
}

function closePromptPanel() {
  $("#prompt-panel").hidden = true;
  $("#prompt-btn").setAttribute("aria-expanded", "false");
}

async function savePrompt(event) {
  event.preventDefault();
  const id = state.currentId;
  if (!id) return;
  const save = $("[data-testid=save-system-prompt]");
  save.disabled = true;
  try {
    upsertSession((await api.setSystemPrompt(id, $("#prompt-text").value)).session);
    closePromptPanel();
    notice("System prompt saved.", "info");
  } catch (err) {
    failure(err, "Could not save the system prompt");
  } finally {
    save.disabled = false;
  }
}

// ---------------------------------------------------------------- composer

function currentSession() {
  return state.currentId ? state.sessions.get(state.currentId) : null;
}

function isBusy() {
  const session = currentSession();
  return Boolean(chat.activeStreamId || session?.busy);
}

function updateComposer() {
  const session = currentSession();
  const readOnly = Boolean(session && session.chat === false);
  const busy = isBusy();
  composer.disabled = readOnly;
  $("#attach").disabled = readOnly;
  sendButton.disabled = readOnly || busy;
  stopButton.hidden = !busy || readOnly;
  sendButton.hidden = busy && !readOnly;
  composerNote.hidden = !readOnly;
  chat.setRevisable(Boolean(session?.chat) && !busy && state.view === "chat");
  composerNote.textContent = readOnly
    ? `This ${sourceLabel(session.source)} session is shown read-only; chat in it from where it started.`
    : "";
  chatEmpty.hidden = !(state.view === "chat" && chat.isEmpty() && !chat.loading);
  autosize();
}

function autosize() {
  composer.style.height = "auto";
  composer.style.height = `${Math.min(composer.scrollHeight, 220)}px`;
}

function send() {
  return sendText(composer.value);
}

/**
 * Send `text` in the session in view (a draft gets its session first). `retrying`: the
 * failed message it sends again, replaced by the new one (put back when the send fails).
 * → whether the turn started.
 */
async function sendText(text, { retrying = null } = {}) {
  const images = retrying ? [] : attachments.list;
  if (!text.trim() && !images.length) return false;
  if (isBusy()) {
    notice("Wait for the reply, or stop it, before sending the next message.", "info");
    return false;
  }
  let id = state.currentId;
  if (!id) {
    id = await createSession();
    if (!id) return false;
  }
  if (!retrying) {
    composer.value = "";
    attachments.clear();
    autosize();
  }
  const placeholder = retrying ? document.createComment("retrying") : null;
  retrying?.replaceWith(placeholder);
  const pending = chat.addPendingUser(text, images);
  chatEmpty.hidden = true;
  try {
    await api.send(id, text, images);
    placeholder?.remove();
    return true;
  } catch (err) {
    chat.dropPendingUser(pending);
    if (images.length) attachments.restore(images);
    if (retrying) placeholder.replaceWith(retrying);
    else if (!composer.value) composer.value = text;
    autosize();
    if (err.code === "active_stream" || err.body?.error?.active_stream_id) {
      notice("The agent is still answering in this session.", "info");
    } else {
      failure(err, "Could not send the message");
    }
    updateComposer();
    return false;
  }
}

/** Replace the last turn: its message edited, or answered again (the server marks the old
 * one superseded). → whether the new turn started. */
async function revise(how, messageId, text) {
  const id = state.currentId;
  if (!id || isBusy()) return false;
  const key = how === "edit" ? "edit_of" : "regenerate_of";
  const pending = how === "edit" ? chat.addPendingUser(text) : null;
  try {
    await api.send(id, text, [], { [key]: messageId });
    return true;
  } catch (err) {
    if (pending) chat.dropPendingUser(pending);
    failure(err, how === "edit" ? "Could not send the edited message" : "Could not answer again");
    return false;
  }
}

async function stop() {
  if (!state.currentId) return;
  stopButton.disabled = true;
  try {
    await api.stop(state.currentId);
  } catch (err) {
    failure(err, "Could not stop the turn");
  } finally {
    stopButton.disabled = false;
  }
}

async function cancelBackground(unitId) {
  try {
    const { status } = await api.cancelBackground(unitId);
    notice(status === "cancelled" ? "Stopped." : "It had already finished.", "ok");
  } catch (err) {
    failure(err, "Could not stop it");
    throw err;
  }
}

async function decide(approvalId, decision) {
  try {
    await api.decide(approvalId, decision);
    return true;
  } catch (err) {
    failure(err, "Could not record the decision");
    return false;
  }
}

// ---------------------------------------------------------------- the event stream

function onEvent(type, data, id) {
  switch (type) {
    case "session":
      if (data.session) upsertSession(data.session);
      return;
    case "toast":
      notifier.show({
        sessionId: data.session_id,
        title: "Background work finished",
        body: `${data.title || sessionTitle(state.sessions.get(data.session_id))}: ${data.goal || ""}`,
        looking: inView(data.session_id) && document.hasFocus(),
      });
      if (!inView(data.session_id)) {
        completionToast(
          {
            sessionId: data.session_id,
            title: data.title || sessionTitle(state.sessions.get(data.session_id)),
            goal: data.goal,
            status: data.status,
          },
          (sid) => openSession(sid),
        );
      }
      return;
    case "delivery":
      if (state.view === "deliveries" && data.delivery) deliveries.upsert(data.delivery);
      return;
    case "session.deleted":
      if (state.sessions.has(data.session_id)) sessionDeleted(data.session_id);
      return;
    default:
      break;
  }
  if (data.session_id && data.session_id === state.currentId && state.view === "chat") {
    chat.handle(type, data, id);
    if (type === "turn.start" || type === "turn.end" || type === "wakeup") updateComposer();
    // A turn may have started background work; a wake-up means some of it came home.
    if (type === "turn.end" || type === "wakeup") refreshBackground(data.session_id);
    if (type === "turn.end" || type === "wakeup") schedulePanel.refresh(data.session_id);
    if (type === "approval") backgroundStrip.setApproval(data.approval);
  }
  if (type === "turn.end" && data.status === "done") {
    notifier.show({
      sessionId: data.session_id,
      title: `Reply in “${sessionTitle(state.sessions.get(data.session_id))}”`,
      body: String(data.content || "").slice(0, 200),
      looking: inView(data.session_id) && document.hasFocus(),
    });
  }
  if (type === "turn.start" || type === "turn.end") {
    const session = state.sessions.get(data.session_id);
    if (session) {
      session.busy = type === "turn.start";
      renderSidebar();
      if (data.session_id === state.currentId) updateComposer();
    }
  }
}

async function refreshBackground(sessionId) {
  try {
    const { background } = await api.background(sessionId);
    if (state.currentId === sessionId && state.view === "chat") backgroundStrip.show(background);
  } catch {
    // The strip is a courtesy; the next turn or wake-up refreshes it.
  }
}

async function onReset() {
  try {
    await refreshSessions();
    if (state.view === "deliveries") await deliveries.load();
    else if (state.currentId) await openSession(state.currentId, { push: false });
  } catch (err) {
    failure(err);
  }
}

// ---------------------------------------------------------------- sidebar on small screens

function openSidebar() {
  app.classList.add("sidebar-open");
  $("#scrim").hidden = false;
  $("#menu-btn").setAttribute("aria-expanded", "true");
}

function closeSidebar() {
  app.classList.remove("sidebar-open");
  $("#scrim").hidden = true;
  $("#menu-btn").setAttribute("aria-expanded", "false");
}

// ---------------------------------------------------------------- login

function showLogin() {
  showView("login");
  setTitle("Sign in", "");
  $("#password").focus();
}

async function login(event) {
  event.preventDefault();
  const error = $("#login-error");
  error.hidden = true;
  try {
    await api.login($("#password").value);
    $("#password").value = "";
    await boot();
  } catch (err) {
    error.hidden = false;
    error.textContent =
      err.status === 429 ? "Too many attempts. Wait a moment and try again." : err.status === 401 ? "Wrong password." : err.message;
  }
}

// ---------------------------------------------------------------- start

function wire() {
  initTheme();
  watchConnection();
  $("[data-testid=new-session]").addEventListener("click", () => newSession());
  $("#new-session-top").addEventListener("click", () => newSession());
  $("#composer-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  composer.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  composer.addEventListener("input", autosize);
  stopButton.addEventListener("click", stop);
  $("#attach").addEventListener("click", () => $("#attach-input").click());
  $("#attach-input").addEventListener("change", async (event) => {
    const input = event.target;
    await attachments.add([...input.files]);
    input.value = "";
    composer.focus();
  });
  transcript.addEventListener("busychange", updateComposer);
  transcript.addEventListener("refetch", () => {
    if (state.currentId && state.view === "chat") openSession(state.currentId, { push: false, quiet: true });
  });
  let searchTimer = 0;
  $("#search").addEventListener("input", (event) => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(async () => {
      state.query = event.target.value.trim();
      if (!state.query) {
        for (const s of state.sessions.values()) delete s._match;
      }
      try {
        await Promise.all([refreshSessions(), searchMessages()]);
      } catch (err) {
        failure(err);
      }
    }, 200);
  });
  const filter = $("#source-filter");
  filter.value = localStorage.getItem("reveille.source") || "";
  state.source = filter.value;
  filter.addEventListener("change", () => {
    state.source = filter.value;
    localStorage.setItem("reveille.source", state.source);
    renderSidebar();
  });
  for (const button of document.querySelectorAll("#delivery-filters button")) {
    button.addEventListener("click", () => {
      for (const b of document.querySelectorAll("#delivery-filters button")) {
        b.setAttribute("aria-pressed", String(b === button));
      }
      deliveries.filter.state = button.dataset.state;
      deliveries.load().catch((err) => failure(err));
    });
  }
  let deliveryTimer = 0;
  $("#delivery-search").addEventListener("input", (event) => {
    clearTimeout(deliveryTimer);
    deliveryTimer = setTimeout(() => {
      deliveries.filter.q = event.target.value.trim();
      deliveries.load().catch((err) => failure(err));
    }, 200);
  });
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-nav]");
    if (!link || event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    navigate(link.getAttribute("data-nav"));
    route();
  });
  window.addEventListener("popstate", () => route());
  $("#menu-btn").addEventListener("click", () =>
    app.classList.contains("sidebar-open") ? closeSidebar() : openSidebar(),
  );
  $("#scrim").addEventListener("click", closeSidebar);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeSidebar();
  });
  document.addEventListener("visibilitychange", () => {
    const session = currentSession();
    if (session?.unread && inView(session.id)) markRead(session.id);
  });
  $("#login-form").addEventListener("submit", login);
  $("#prompt-btn").addEventListener("click", () => ($("#prompt-panel").hidden ? openPromptPanel() : closePromptPanel()));
  $("#prompt-cancel").addEventListener("click", closePromptPanel);
  $("#prompt-panel").addEventListener("submit", savePrompt);
  for (const link of [$("#export-md"), $("#export-json")]) {
    link.addEventListener("click", () => ($("#export-menu").open = false));
  }
  onLoginRequired(() => showLogin());
}

async function boot() {
  let data;
  try {
    data = await api.bootstrap();
  } catch (err) {
    showView("loading");
    $("#view-loading").firstElementChild.textContent = `Cannot reach Reveille: ${err.message}`;
    setTimeout(boot, 3000);
    return;
  }
  state.boot = data;
  setCsrfToken(data.csrf_token);
  $("#model-name").textContent = data.model ? `Model: ${data.model}` : "";
  // Why other surfaces' conversations are not listed (an API key without a web UI password).
  const gate = $("#gate-notice");
  gate.textContent = data.notice || "";
  gate.hidden = !data.notice;
  if (data.auth_required && !data.logged_in) {
    showLogin();
    return;
  }
  if (!state.started) {
    state.started = true;
    await connect({ onEvent, onReset, onState: streamStateChanged });
  }
  try {
    await refreshSessions();
  } catch (err) {
    failure(err);
  }
  await route();
  app.dataset.ready = "true";
}

wire();
boot();
