// The workspace panel: files the agent wrote in this session, each a download link.
// Refreshed when the panel opens and after each turn ends.

export class FilesPanel {
  constructor(panel, url) {
    this.panel = panel;
    this.url = url;
    this.list = panel.querySelector("[data-file-list]");
    this.empty = panel.querySelector("[data-files-empty]");
    document.addEventListener("click", (click) => {
      if (click.target.closest("[data-action=toggle-files]")) this.toggle();
    });
  }

  toggle(open = this.panel.hidden) {
    this.panel.hidden = !open;
    for (const button of document.querySelectorAll("[data-action=toggle-files][aria-controls]")) button.setAttribute("aria-expanded", String(open));
    if (open) {
      this.refresh();
      this.panel.querySelector("a, button")?.focus();
    }
  }

  async refresh() {
    let files = [];
    try {
      const response = await fetch(this.url, { credentials: "same-origin" });
      files = (await response.json()).files || [];
    } catch {
      return;
    }
    this.list.replaceChildren(
      ...files.map((file) => {
        const li = document.createElement("li");
        const link = document.createElement("a");
        link.href = file.url;
        link.textContent = file.path;
        link.setAttribute("download", "");
        const size = document.createElement("span");
        size.className = "meta";
        size.textContent = ` ${formatSize(file.size)}`;
        li.append(link, size);
        return li;
      }),
    );
    this.empty.hidden = files.length > 0;
  }
}

function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}
