// Whether the server is reachable: the sidebar's live dot and ONE "Reconnecting…" banner.
// The banner shows when a request fails without an answer (api.js reports it) or the event
// stream drops, and goes away once the stream is back; the stream reconnects by itself.
import { onNetworkError, onReachable } from "/static/api.js";
import { $ } from "/static/dom.js";

const LABELS = { live: "Live", reconnecting: "Reconnecting…", closed: "Offline", connecting: "Connecting…" };
let streamState = "connecting";

function banner(show) {
  $("#reconnecting").hidden = !show;
}

/** The event stream's state (events.js `onState`). */
export function streamStateChanged(value) {
  streamState = value;
  const node = $("#conn");
  node.dataset.state = value;
  const label = LABELS[value] || value;
  node.title = label;
  node.firstChild.textContent = label;
  if (value === "live") banner(false);
  else if (value === "reconnecting" || value === "closed") banner(true);
}

export function watchConnection() {
  onNetworkError(() => banner(true));
  // An answer while the stream is live: the failure was a blip, nothing is reconnecting.
  onReachable(() => {
    if (streamState === "live") banner(false);
  });
}
