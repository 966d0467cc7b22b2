// Images attached to the message being written: picked with the attach button, checked here
// (kind and size, with a clear word when refused), shown as removable thumbnails, and sent
// with the message as data: URLs. The server checks them again.
import { el } from "/static/dom.js";
import { notice } from "/static/toasts.js";

const TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
export const MAX_IMAGES = 4;

function size(n) {
  return n >= 1024 * 1024 ? `${(n / 1024 / 1024).toFixed(1)} MB` : `${Math.max(1, Math.round(n / 1024))} KB`;
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class Attachments {
  /** box: where the thumbnails go; maxBytes(): the largest image the server takes. */
  constructor(box, { maxBytes }) {
    this.box = box;
    this.maxBytes = maxBytes;
    this.items = []; // {name, url}
  }

  get list() {
    return this.items.map(({ name, url }) => ({ name, url }));
  }

  /** Add the picked files that are images small enough; say why any other is left out. */
  async add(files) {
    for (const file of files) {
      const name = file.name || "image";
      if (!TYPES.has(file.type)) {
        notice(`${name} is not an image this chat can send (PNG, JPEG, GIF or WebP).`);
        continue;
      }
      const max = this.maxBytes();
      if (file.size > max) {
        notice(`${name} is too large (${size(file.size)}): images up to ${size(max)} can be sent.`);
        continue;
      }
      if (this.items.length >= MAX_IMAGES) {
        notice(`At most ${MAX_IMAGES} images per message.`);
        break;
      }
      try {
        this.items.push({ name, url: await readAsDataUrl(file) });
      } catch {
        notice(`${name} could not be read.`);
      }
    }
    this.render();
  }

  clear() {
    this.items = [];
    this.render();
  }

  /** Put back what a failed send took. */
  restore(items) {
    this.items = [...items];
    this.render();
  }

  render() {
    this.box.hidden = !this.items.length;
    this.box.replaceChildren(
      ...this.items.map((item, index) =>
        el(
          "div",
          { class: "attachment", dataset: { testid: "attachment" } },
          el("img", { src: item.url, alt: item.name, title: item.name }),
          el("button", {
            type: "button",
            "aria-label": `Remove ${item.name}`,
            text: "×",
            on: {
              click: () => {
                this.items.splice(index, 1);
                this.render();
              },
            },
          }),
        ),
      ),
    );
  }
}
