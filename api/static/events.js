// The tab's ONE event stream. EventSource reconnects by itself and sends Last-Event-ID, so the
// server replays what was missed; `reset` (an id too old to replay) makes the tab refetch.

const TYPES = [
  "session",
  "turn.start",
  "turn.delta",
  "turn.tool",
  "turn.end",
  "wakeup",
  "toast",
  "approval",
  "delivery",
  "session.deleted",
];

let source = null;

/**
 * connect({onEvent(type, data, id), onReset(), onState(state)}) → Promise resolved on the
 * first open (or after a short wait, so a slow stream never blocks the first render).
 */
export function connect({ onEvent, onReset, onState }, { recreated = false } = {}) {
  if (source) return Promise.resolve();
  source = new EventSource("/api/events", { withCredentials: true });
  let firstOpen;
  const opened = new Promise((resolve) => {
    firstOpen = resolve;
    setTimeout(resolve, 4000);
  });
  source.addEventListener("open", () => {
    onState("live");
    firstOpen();
    // A new EventSource has no Last-Event-ID to resume from: refetch what the tab shows.
    if (recreated) {
      recreated = false;
      onReset();
    }
  });
  source.addEventListener("error", () => {
    onState(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
    if (source.readyState === EventSource.CLOSED) {
      // The server refused the stream (e.g. logged out): try again later, still one stream.
      source = null;
      setTimeout(() => connect({ onEvent, onReset, onState }, { recreated: true }), 3000);
    }
  });
  source.addEventListener("reset", () => onReset());
  for (const type of TYPES) {
    source.addEventListener(type, (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      onEvent(type, data, event.lastEventId);
    });
  }
  return opened;
}

export function disconnect() {
  if (source) source.close();
  source = null;
}
