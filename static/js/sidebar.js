// The sessions sidebar: search with snippets, pin / rename / archive / delete in place,
// the drawer on small screens, live titles, and the shortcuts Ctrl/Cmd+K (search) and
// Ctrl/Cmd+Shift+O (new session). Server-rendered (templates/sessions/_sidebar.html);
// this module only enhances it.

const $ = (selector, root = document) => root.querySelector(selector);
// Wait this long after the last keystroke before searching (ms): one request per pause.
const SEARCH_DEBOUNCE_MS = 200;

function csrfToken() {
  return $("input[name=csrfmiddlewaretoken]")?.value || "";
}

async function post(url, fields) {
  // Form-encoded, not multipart: an empty multipart body is a 400 to Django's parser.
  const body = new URLSearchParams(fields);
  const response = await fetch(url, { method: "POST", body, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() } });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || "That did not work; try again.");
  return data;
}

function rowUrl(row, tail) {
  return `${$(".session-link", row).getAttribute("href")}${tail}`;
}

export class Sidebar {
  constructor(root, { currentSession = "", searchUrl = "", onStatus = () => {} } = {}) {
    this.root = root;
    this.current = currentSession;
    this.searchUrl = searchUrl;
    this.onStatus = onStatus;
    this.input = $("[data-search-input]", root);
    this.results = $("[data-search-results]", root);
    this.groups = $("[data-session-groups]", root);
    this.toggle = $("[data-action=toggle-sidebar]");
    this.scrim = $(".drawer-scrim");
    this.timer = 0;
    this.searchSeq = 0;
    this.input?.addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.search(this.input.value), SEARCH_DEBOUNCE_MS);
    });
    $("[data-sidebar-search]", root)?.addEventListener("submit", (submit) => {
      submit.preventDefault();
      this.search(this.input.value);
    });
    root.addEventListener("click", (click) => this.onClick(click));
    document.addEventListener("click", (click) => {
      const button = click.target.closest("[data-action=toggle-sidebar], [data-action=close-sidebar]");
      if (button) this.setOpen(button.dataset.action === "toggle-sidebar" ? !this.isOpen() : false);
    });
    document.addEventListener("keydown", (key) => this.onKey(key));
  }

  isOpen() {
    return document.body.classList.contains("drawer-open");
  }

  setOpen(open) {
    document.body.classList.toggle("drawer-open", open);
    if (this.scrim) this.scrim.hidden = !open;
    this.toggle?.setAttribute("aria-expanded", String(open));
    if (open) this.input?.focus();
  }

  onKey(key) {
    const mod = key.ctrlKey || key.metaKey;
    if (mod && !key.shiftKey && key.key.toLowerCase() === "k") {
      key.preventDefault();
      if (window.matchMedia("(max-width: 900px)").matches) this.setOpen(true);
      this.input?.focus();
      this.input?.select();
    } else if (mod && key.shiftKey && key.key.toLowerCase() === "o") {
      key.preventDefault();
      $("[data-new-session-form]", this.root)?.requestSubmit();
    } else if (key.key === "Escape" && this.isOpen()) {
      this.setOpen(false);
      this.toggle?.focus();
    } else if (key.key === "Escape" && document.activeElement === this.input && this.input.value) {
      this.input.value = "";
      this.search("");
    }
  }

  async search(query) {
    const seq = ++this.searchSeq;
    const text = query.trim();
    if (!text) {
      this.results.hidden = true;
      this.results.replaceChildren();
      this.groups.hidden = false;
      return;
    }
    let body;
    try {
      const response = await fetch(`${this.searchUrl}?q=${encodeURIComponent(text)}`, { credentials: "same-origin" });
      body = await response.json();
    } catch {
      body = { results: [] };
    }
    if (seq !== this.searchSeq) return; // a newer search is under way
    const list = document.createElement("ul");
    for (const item of body.results || []) {
      const li = document.createElement("li");
      li.className = "search-hit";
      const link = document.createElement("a");
      link.href = item.url;
      link.className = "session-link";
      link.textContent = item.title;
      li.append(link);
      if (item.snippet) {
        const snippet = document.createElement("p");
        snippet.className = "snippet";
        snippet.textContent = item.snippet;
        li.append(snippet);
      }
      list.append(li);
    }
    const heading = document.createElement("h2");
    heading.className = "group-name";
    heading.textContent = body.results && body.results.length ? `Results for “${text}”` : `No sessions match “${text}”`;
    this.results.replaceChildren(heading, list);
    this.results.hidden = false;
    this.groups.hidden = true;
  }

  async onClick(click) {
    const button = click.target.closest("button[data-action]");
    const row = button?.closest("[data-session-id]");
    if (!row) return;
    const id = row.dataset.sessionId;
    const title = $("[data-session-title]", row).textContent;
    try {
      if (button.dataset.action === "pin-session") {
        const pinned = row.dataset.pinned !== "1";
        await post(rowUrl(row, "pin"), { pinned: pinned ? "1" : "0" });
        row.dataset.pinned = pinned ? "1" : "0";
        button.textContent = pinned ? "Unpin" : "Pin";
        button.setAttribute("aria-pressed", String(pinned));
        button.setAttribute("aria-label", `${pinned ? "Unpin" : "Pin"} ${title}`);
        this.moveToGroup(row, pinned ? "Pinned" : "Today");
      } else if (button.dataset.action === "rename-session") {
        this.startRename(row);
      } else if (button.dataset.action === "archive-session") {
        await post(rowUrl(row, "archive.json"), { archived: "1" });
        this.removeRow(row, id, "Session archived.");
      } else if (button.dataset.action === "delete-session") {
        if (!window.confirm(`Delete “${title}” and its files? This cannot be undone.`)) return;
        await post(rowUrl(row, "delete.json"), {});
        this.removeRow(row, id, "Session deleted.");
      }
    } catch (error) {
      this.onStatus(error.message);
    }
  }

  removeRow(row, id, words) {
    const group = row.closest(".session-group");
    row.remove();
    if (group && !group.querySelector("li")) group.remove();
    this.onStatus(words);
    if (id === this.current) window.location.assign("/");
  }

  moveToGroup(row, name) {
    let group = [...this.groups.querySelectorAll(".session-group")].find((g) => $(".group-name", g).textContent === name);
    if (!group) {
      group = document.createElement("section");
      group.className = "session-group";
      const heading = document.createElement("h2");
      heading.className = "group-name";
      heading.textContent = name;
      group.append(heading, document.createElement("ul"));
      this.groups.prepend(group);
    }
    const old = row.closest(".session-group");
    $("ul", group).prepend(row);
    if (old && old !== group && !old.querySelector("li")) old.remove();
  }

  startRename(row) {
    const link = $("[data-session-title]", row);
    const form = document.createElement("form");
    form.className = "rename-form";
    const label = document.createElement("label");
    label.className = "visually-hidden";
    label.textContent = "New title";
    const input = document.createElement("input");
    input.type = "text";
    input.value = link.textContent;
    input.maxLength = 200;
    input.id = `rename-${row.dataset.sessionId}`;
    label.htmlFor = input.id;
    form.append(label, input);
    link.hidden = true;
    link.after(form);
    input.focus();
    input.select();
    const done = () => {
      form.remove();
      link.hidden = false;
    };
    input.addEventListener("keydown", (key) => {
      if (key.key === "Escape") {
        key.stopPropagation();
        done();
        link.focus();
      }
    });
    input.addEventListener("blur", () => setTimeout(done, 150));
    form.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      try {
        const body = await post(rowUrl(row, "title"), { title: input.value });
        this.setTitle(row.dataset.sessionId, body.title);
      } catch (error) {
        this.onStatus(error.message);
      }
      done();
      link.focus();
    });
  }

  // A session's title changed (renamed here, or `session.title` from the socket).
  setTitle(id, title) {
    const row = this.root.querySelector(`[data-session-id="${CSS.escape(id)}"]`);
    if (row) $("[data-session-title]", row).textContent = title;
    if (id === this.current) {
      const heading = $("[data-chat-title]");
      if (heading) heading.textContent = title;
      document.title = `${title} · OpenWorker`;
    }
  }
}
