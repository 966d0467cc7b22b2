// Browser notifications (opt-in) and the unread count in the tab's title. A notification is
// shown only when the person turned them on, the browser allows them, and the page is not
// what they are looking at (another tab, or another chat); clicking it opens the chat.
import { notice } from "/static/toasts.js";

const KEY = "reveille.notifications";

export class Notifier {
  /** button: the toggle; onOpen(sessionId) opens a chat. */
  constructor(button, { onOpen }) {
    this.button = button;
    this.onOpen = onOpen;
    this.base = document.title || "Reveille";
    this.unread = 0;
    button.addEventListener("click", () => this.toggle());
    this.render();
  }

  supported() {
    return typeof window.Notification === "function";
  }

  enabled() {
    return this.supported() && localStorage.getItem(KEY) === "on" && Notification.permission === "granted";
  }

  /** Turn them on (asking the browser's permission first when it was never asked) or off. */
  async toggle() {
    if (this.enabled()) {
      localStorage.setItem(KEY, "off");
      this.render();
      return;
    }
    if (!this.supported()) {
      notice("This browser cannot show notifications.", "info");
      return;
    }
    let permission = Notification.permission;
    if (permission === "default") {
      try {
        permission = await Notification.requestPermission();
      } catch {
        permission = "denied";
      }
    }
    if (permission !== "granted") {
      localStorage.setItem(KEY, "off");
      notice("Notifications are blocked for this site; allow them in the browser's site settings.", "info");
    } else {
      localStorage.setItem(KEY, "on");
    }
    this.render();
  }

  render() {
    const on = this.enabled();
    const label = `Browser notifications: ${on ? "on" : "off"}`;
    this.button.setAttribute("aria-pressed", String(on));
    this.button.setAttribute("aria-label", label);
    this.button.title = label;
  }

  /** Show one, if allowed and the person is not looking at `sessionId` already. */
  show({ sessionId, title, body, looking }) {
    if (!this.enabled() || looking) return;
    try {
      const note = new Notification(String(title || "Reveille"), {
        body: String(body || ""),
        tag: sessionId ? `reveille:${sessionId}` : undefined,
        icon: "/static/icon.svg",
      });
      note.onclick = () => {
        window.focus();
        if (sessionId) this.onOpen(sessionId);
        note.close();
      };
    } catch {
      // Some browsers allow notifications only from a service worker: the toast remains.
    }
  }

  /** The page's own title, behind the count of chats with something unread: "(2) Reveille". */
  setTitle(base) {
    this.base = base;
    this.renderTitle();
  }

  setUnread(count) {
    this.unread = count;
    this.renderTitle();
  }

  renderTitle() {
    document.title = this.unread > 0 ? `(${this.unread}) ${this.base}` : this.base;
  }
}
