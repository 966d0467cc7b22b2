// The web UI's HTTP client: JSON in and out, the CSRF header on every state-changing request.

let csrfToken = "";
const listeners = new Set();
const networkListeners = new Set();
const reachableListeners = new Set();

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "";
    this.body = body || {};
    this.network = false;
  }
}

export function setCsrfToken(token) {
  csrfToken = token || "";
}

/** Called with the ApiError whenever the server answers 401 login_required. */
export function onLoginRequired(fn) {
  listeners.add(fn);
}

/** Called with the ApiError whenever a request fails without an answer (network error). */
export function onNetworkError(fn) {
  networkListeners.add(fn);
}

/** Called whenever the server answered a request (any status). */
export function onReachable(fn) {
  reachableListeners.add(fn);
}

export async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = csrfToken;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
    });
  } catch {
    // The server is not reachable: the page shows its reconnecting banner, not a toast.
    const err = new ApiError(0, { error: { message: "Reconnecting…", code: "network" } });
    err.network = true;
    for (const fn of networkListeners) fn(err);
    throw err;
  }
  for (const fn of reachableListeners) fn();
  let data = null;
  if (response.status !== 204) {
    const text = await response.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = { error: { message: text.slice(0, 200) } };
      }
    }
  }
  if (!response.ok) {
    const err = new ApiError(response.status, data);
    if (response.status === 401 && !path.startsWith("/api/login")) {
      for (const fn of listeners) fn(err);
    }
    throw err;
  }
  return data;
}

const enc = encodeURIComponent;

export const api = {
  bootstrap: () => request("GET", "/api/bootstrap"),
  login: (password) => request("POST", "/api/login", { password }),
  logout: () => request("POST", "/api/logout", {}),
  sessions: (q) => request("GET", q ? `/api/sessions?q=${enc(q)}` : "/api/sessions"),
  search: (q) => request("GET", `/api/search?q=${enc(q)}`),
  createSession: (title) => request("POST", "/api/sessions", title ? { title } : {}),
  session: (id) => request("GET", `/api/sessions/${enc(id)}`),
  renameSession: (id, title) => request("PATCH", `/api/sessions/${enc(id)}`, { title }),
  setSystemPrompt: (id, prompt) =>
    request("PATCH", `/api/sessions/${enc(id)}`, { system_prompt: prompt }),
  deleteSession: (id) => request("DELETE", `/api/sessions/${enc(id)}`),
  olderItems: (id, before) =>
    request("GET", `/api/sessions/${enc(id)}/items?before=${enc(before)}`),
  background: (id) => request("GET", `/api/sessions/${enc(id)}/background`),
  cancelBackground: (unitId) => request("POST", `/api/background/${enc(unitId)}/cancel`, {}),
  schedules: (id) => request("GET", `/api/schedules?session=${enc(id)}`),
  cancelSchedule: (id) => request("DELETE", `/api/schedules/${enc(id)}`),
  markRead: (id) => request("POST", `/api/sessions/${enc(id)}/read`, {}),
  send: (id, text, images = [], extra = {}) =>
    request("POST", `/api/sessions/${enc(id)}/messages`, {
      text,
      ...(images.length ? { images } : {}),
      ...extra,
    }),
  stop: (id) => request("POST", `/api/sessions/${enc(id)}/stop`, {}),
  decide: (approvalId, decision) =>
    request("POST", `/api/approvals/${enc(approvalId)}`, { decision }),
  deliveries: ({ state, q } = {}) => {
    const params = new URLSearchParams();
    if (state) params.set("state", state);
    if (q) params.set("q", q);
    const query = params.toString();
    return request("GET", query ? `/api/deliveries?${query}` : "/api/deliveries");
  },
  redeliver: (id) => request("POST", `/api/deliveries/${enc(id)}/redeliver`, {}),
  drop: (id) => request("POST", `/api/deliveries/${enc(id)}/drop`, {}),
};
