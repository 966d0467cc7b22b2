// The agent's markdown replies: marked → DOMPurify → DOM. Nothing else goes through here;
// every other string the UI shows is set with textContent.
import { marked } from "/static/vendor/marked/marked.esm.js";
import DOMPurify from "/static/vendor/dompurify/purify.es.mjs";

marked.setOptions({ gfm: true, breaks: true });

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// Raw HTML a model writes (``<img src=x onerror=…>`` quoted from a goal, say) is shown as the
// characters it is, not dropped silently by the sanitizer: the reader sees what was said.
marked.use({
  renderer: {
    html(token) {
      return escapeHtml(typeof token === "string" ? token : token.text);
    },
  },
});

const SAFE_URL = /^(?:https?:|mailto:|#|\/(?!\/))/i;

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    // Only http(s), mailto and same-site links survive; javascript:, data:, vbscript: … go.
    if (!SAFE_URL.test(href.trim())) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "IMG") {
    // Inline images only: a same-origin path could be an API route (an image pointed at
    // /api/events holds one of the tab's connections for good), a remote one a tracker.
    const src = node.getAttribute("src") || "";
    if (!INLINE_IMAGE.test(src.trim())) node.removeAttribute("src");
  }
});

const INLINE_IMAGE = /^data:image\/(?:png|gif|jpeg|webp);base64,[a-z0-9+/=\s]*$/i;

/** An image that may not load is shown as its description, in text. */
function describeBlockedImages(fragment) {
  for (const img of fragment.querySelectorAll("img:not([src])")) {
    const alt = img.getAttribute("alt") || "";
    img.replaceWith(document.createTextNode(`[image${alt ? `: ${alt}` : ""}]`));
  }
  return fragment;
}

const PURIFY = {
  ALLOWED_TAGS: [
    "a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "i", "img", "input", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "sup",
    "table", "tbody", "td", "th", "thead", "tr", "ul",
  ],
  ALLOWED_ATTR: ["href", "title", "alt", "src", "class", "type", "checked", "disabled", "align"],
  ALLOW_DATA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

let hljs = null;
let hljsPromise = null;
function highlighter() {
  hljsPromise ||= import("/static/vendor/highlight/highlight.min.js").then((m) => {
    hljs = m.default;
    hljs.configure({ ignoreUnescapedHTML: true });
    return hljs;
  });
  return hljsPromise;
}

/** Sanitised DOM fragment of a markdown string. */
export function renderMarkdown(text) {
  const html = marked.parse(String(text ?? ""), { async: false });
  return describeBlockedImages(DOMPurify.sanitize(html, PURIFY));
}

function highlightAll(target) {
  for (const block of target.querySelectorAll("pre code")) {
    if (block.dataset.highlighted) continue;
    const lang = /language-([\w-]+)/.exec(block.className)?.[1];
    if (lang && !hljs.getLanguage(lang)) block.className = "";
    // highlight.js reads textContent and writes escaped spans.
    hljs.highlightElement(block);
  }
}

/** Replace `target`'s content with the rendered markdown; code blocks highlighted lazily. */
export function setMarkdown(target, text) {
  target.replaceChildren(renderMarkdown(text));
  const blocks = target.querySelectorAll("pre code");
  if (!blocks.length) return;
  for (const block of blocks) decorateCodeBlock(block);
  if (hljs) {
    highlightAll(target);
    return;
  }
  highlighter()
    .then(() => target.isConnected && highlightAll(target))
    .catch(() => {});
}

function decorateCodeBlock(block) {
  const pre = block.parentElement;
  if (!pre || pre.querySelector(".copy")) return;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.addEventListener("click", () => {
    navigator.clipboard?.writeText(block.textContent || "").then(
      () => {
        button.textContent = "Copied";
        setTimeout(() => (button.textContent = "Copy"), 1500);
      },
      () => {},
    );
  });
  pre.append(button);
}
