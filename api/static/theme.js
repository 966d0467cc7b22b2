// Light and dark themes: the system's preference unless the user picked one with the toggle.
const KEY = "reveille.theme";
const media = window.matchMedia("(prefers-color-scheme: dark)");

function stored() {
  try {
    return localStorage.getItem(KEY);
  } catch {
    return null;
  }
}

let choice = stored();

export function currentTheme() {
  const picked = choice;
  if (picked === "light" || picked === "dark") return picked;
  return media.matches ? "dark" : "light";
}

function apply() {
  const theme = currentTheme();
  document.documentElement.dataset.theme = theme;
  const button = document.getElementById("theme-toggle");
  if (button) {
    button.setAttribute("aria-pressed", String(theme === "dark"));
    button.setAttribute("aria-label", theme === "dark" ? "Switch to light theme" : "Switch to dark theme");
    button.title = button.getAttribute("aria-label");
  }
}

export function initTheme() {
  apply();
  media.addEventListener("change", apply);
  document.getElementById("theme-toggle")?.addEventListener("click", () => {
    const next = currentTheme() === "dark" ? "light" : "dark";
    choice = next;
    try {
      localStorage.setItem(KEY, next);
    } catch {
      /* private mode: the toggle still works for this page */
    }
    apply();
  });
}
