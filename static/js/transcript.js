// The committed transcript: messages come from the server as HTML carrying their Markdown
// source (`data-markdown`), rendered here with the same renderer that draws streamed text,
// so a committed reply, and the page after a reload, equal what was streamed.

import { $, data, el, keepPinned, nearBottom, showConnection, state, ui } from "./page.js";
import { currentLeaf, decorate, extendsPath } from "./branches.js";
import { hydrate } from "./renderer.js";

export function renderedSeqs() {
  return new Set([...ui.items.querySelectorAll("[data-seq]")].map((node) => Number(node.dataset.seq)));
}

function lastRenderedSeq() {
  const all = ui.items.querySelectorAll("[data-seq]");
  return all.length ? Number(all[all.length - 1].dataset.seq) : 0;
}

let catchUpChain = Promise.resolve();

// Fetch and insert every committed message after the last one shown, in order. Calls are
// chained so two events never insert the same message twice.
export function catchUp() {
  catchUpChain = catchUpChain.then(fetchAfter).catch(() => {
    showConnection("Could not load the latest messages; reload the page.");
  });
  return catchUpChain;
}

async function fetchAfter() {
  const { items } = ui;
  for (;;) {
    const after = lastRenderedSeq();
    const response = await fetch(`${data.messagesUrl}?after=${after}`, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    const pinned = nearBottom();
    const shown = renderedSeqs();
    for (const message of body.messages) {
      if (shown.has(message.seq)) continue;
      const holder = document.createElement("template");
      holder.innerHTML = message.html; // server-rendered, autoescaped and sanitised
      const node = holder.content.querySelector("article");
      if (!extendsPath(node)) continue; // on another branch than the one shown
      items.append(holder.content);
      state.leaf = message.seq; // the path shown grew: this is its leaf now
      if (message.role === "tool") markToolDone(items.lastElementChild);
    }
    hydrate(items);
    decorate(items);
    keepPinned(pinned);
    if (!body.more) return;
  }
}

export async function loadEarlier(button) {
  const { items, scroller, transcript } = ui;
  button.disabled = true;
  try {
    // Older messages of the path shown (the server pages along the active leaf's path).
    const response = await fetch(`${data.messagesUrl}?before=${state.firstSeq}&leaf=${currentLeaf()}`, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    const fromBottom = scroller.scrollHeight - scroller.scrollTop;
    items.insertAdjacentHTML("afterbegin", body.html);
    hydrate(items);
    decorate(items);
    scroller.scrollTop = scroller.scrollHeight - fromBottom; // keep the reader's place
    state.firstSeq = body.first_seq;
    state.hasMore = body.has_more;
    $(".load-earlier", transcript).hidden = !body.has_more;
  } catch {
    showConnection("Could not load earlier messages.");
  } finally {
    button.disabled = false;
  }
}

function markToolDone(node) {
  if (!node || !node.dataset.callId) return;
  const card = ui.items.querySelector(`.tool-card[data-call-id="${CSS.escape(node.dataset.callId)}"] [data-tool-status]`);
  if (card) card.textContent = node.classList.contains("is-error") ? "failed" : "done";
}

// `tool.started`: the call's card says it runs.
export function markToolRunning(callId) {
  const status = ui.items.querySelector(`.tool-card[data-call-id="${CSS.escape(callId)}"] [data-tool-status]`);
  if (status) status.textContent = "running…";
}

// A live checkpoint: its summary rendered as Markdown, as after a reload.
export function showCheckpoint(checkpoint) {
  const summary = el("summary", { text: "Earlier messages were summarised for the model" });
  const aside = el("aside", { className: "checkpoint", "aria-label": "Compaction checkpoint", dataset: { boundary: String(checkpoint.boundary_seq) } }, [
    el("details", {}, [summary, el("div", { className: "markdown", dataset: { markdown: checkpoint.summary || "" } })]),
  ]);
  hydrate(aside);
  const boundary = ui.items.querySelector(`[data-seq="${Number(checkpoint.boundary_seq)}"]`);
  if (boundary) boundary.before(aside);
  else ui.items.append(aside);
}
