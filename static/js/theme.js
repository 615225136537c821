// The theme: "system" follows prefers-color-scheme (CSS does it), "light"/"dark" force a
// palette. A change applies at once and is remembered per user (POST /account/theme).

const THEMES = new Set(["system", "light", "dark"]);

function csrfToken(form) {
  return form.querySelector("input[name=csrfmiddlewaretoken]")?.value || "";
}

export function applyTheme(theme) {
  if (!THEMES.has(theme)) return;
  document.documentElement.dataset.theme = theme;
  for (const select of document.querySelectorAll("[data-theme-select]")) select.value = theme;
}

async function save(form, theme) {
  const body = new FormData();
  body.append("theme", theme);
  await fetch(form.action, { method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken(form) } });
}

for (const form of document.querySelectorAll("[data-theme-form]")) {
  const select = form.querySelector("[data-theme-select]");
  select.addEventListener("change", () => {
    applyTheme(select.value);
    save(form, select.value).catch(() => {});
  });
}
