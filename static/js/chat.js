// The chat page: the socket (docs/PROTOCOL.md) brings live events; committed messages
// come from the server as HTML carrying their Markdown source, which renderer.js renders
// in the page, the same renderer that draws streamed text while it arrives (stream.js).
// So a reply looks the same while it streams and after a reload.
//
// Nothing the model or a tool produces is ever inserted as markup unsanitised: Markdown
// goes through renderer.js (DOMPurify), server HTML is sanitised by the server, and
// everything else goes through textContent.

import { initPickers, pickerValue } from "./picker.js";
import { hydrate } from "./renderer.js";
import { SessionSocket } from "./socket.js";
import { StreamView } from "./stream.js";
import { Sidebar } from "./sidebar.js";
import { FilesPanel } from "./files.js";

const data = JSON.parse(document.getElementById("page-data").textContent);
const $ = (selector, root = document) => root.querySelector(selector);
const csrf = $("[data-composer] input[name=csrfmiddlewaretoken]").value;

const transcript = $("#transcript");
// The chat column scrolls (the sidebar and composer stay put), not the document.
const scroller = $("main.chat") || document.scrollingElement;
const items = $("[data-items]", transcript);
const live = $("[data-live]", transcript);
const approvals = $("[data-approvals]");
const connection = $("[data-connection]");
const composer = $("[data-composer]");
const textarea = $("[data-composer-text]");
const sendButton = $("[data-send]");
const stopButton = $("[data-action=stop]");
const pendingList = $("[data-pending-attachments]");
const attachmentWarning = $("[data-attachment-warning]");
const modelForm = $("[data-model-form]");
const modelNote = $("[data-model-note]");

// Nearer the bottom than this (px), new content keeps the view pinned to the bottom.
const STICKY_SCROLL_PX = 120;
const ACTIVE = new Set(["queued", "running", "awaiting_approval"]);
const RETRYABLE = new Set(["failed", "interrupted"]);

const state = {
  firstSeq: data.firstSeq,
  hasMore: data.hasMore,
  caps: data.caps,
  model: data.model,
  turns: new Map(), // turn id → {lastSeq, status, cost, costUnknown}
  activeTurn: null,
  stream: null, // {turn, el, text, reasoning}
  attachments: [], // uploaded, not yet sent: {id, name, mime, size, preview}
  sending: false,
  sessionCost: data.sessionCost === null ? null : Number(data.sessionCost),
  contextTokens: data.contextTokens,
};

// --- helpers -------------------------------------------------------------------------------

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key in node && key !== "type") node[key] = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function nearBottom() {
  return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < STICKY_SCROLL_PX;
}

function keepPinned(wasNearBottom) {
  if (wasNearBottom) scroller.scrollTop = scroller.scrollHeight;
}

function renderedSeqs() {
  return new Set([...items.querySelectorAll("[data-seq]")].map((node) => Number(node.dataset.seq)));
}

function lastRenderedSeq() {
  const all = items.querySelectorAll("[data-seq]");
  return all.length ? Number(all[all.length - 1].dataset.seq) : 0;
}

function turnState(turn) {
  if (!state.turns.has(turn)) state.turns.set(turn, { lastSeq: 0, status: null, cost: 0, costUnknown: false });
  return state.turns.get(turn);
}

function showConnection(text) {
  connection.textContent = text;
}

// A new attempt starts (send, retry, a running status): last attempt's errors go at once.
function clearErrors() {
  showConnection("");
  for (const footer of items.querySelectorAll("[data-turn-footer]")) {
    if (footer.querySelector(".error")) footer.remove();
  }
}

function formatCost(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return null;
  return value >= 1 ? `$${value.toFixed(2)}` : `$${value.toFixed(4)}`;
}

// --- meters --------------------------------------------------------------------------------

function updateContextMeter() {
  const box = $("[data-context-meter]");
  const windowSize = state.caps && state.caps.context_window;
  if (!windowSize || !state.contextTokens) {
    box.hidden = !windowSize;
    if (!windowSize) return;
  }
  box.hidden = false;
  const meter = $("meter", box);
  meter.max = windowSize;
  meter.value = Math.min(state.contextTokens || 0, windowSize);
  const pct = Math.min(100, Math.round((100 * (state.contextTokens || 0)) / windowSize));
  $("[data-context-text]", box).textContent = `${pct}% of ${windowSize} tokens`;
}

function updateSessionCost() {
  const box = $("[data-session-cost]");
  const text = formatCost(state.sessionCost);
  box.hidden = text === null || state.sessionCost === 0;
  $("[data-session-cost-value]", box).textContent = text || "";
}

// --- committed messages --------------------------------------------------------------------

let catchUpChain = Promise.resolve();

// Fetch and insert every committed message after the last one shown, in order. Calls are
// chained so two events never insert the same message twice.
function catchUp() {
  catchUpChain = catchUpChain.then(fetchAfter).catch(() => {
    showConnection("Could not load the latest messages; reload the page.");
  });
  return catchUpChain;
}

async function fetchAfter() {
  for (;;) {
    const after = lastRenderedSeq();
    const response = await fetch(`${data.messagesUrl}?after=${after}`, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    const pinned = nearBottom();
    const shown = renderedSeqs();
    for (const message of body.messages) {
      if (shown.has(message.seq)) continue;
      items.insertAdjacentHTML("beforeend", message.html);
      if (message.role === "tool") markToolDone(items.lastElementChild);
    }
    hydrate(items);
    keepPinned(pinned);
    if (!body.more) return;
  }
}

async function loadEarlier(button) {
  button.disabled = true;
  try {
    const response = await fetch(`${data.messagesUrl}?before=${state.firstSeq}`, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    const fromBottom = scroller.scrollHeight - scroller.scrollTop;
    items.insertAdjacentHTML("afterbegin", body.html);
    hydrate(items);
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
  const card = items.querySelector(`.tool-card[data-call-id="${CSS.escape(node.dataset.callId)}"] [data-tool-status]`);
  if (card) card.textContent = node.classList.contains("is-error") ? "failed" : "done";
}

// --- streaming -----------------------------------------------------------------------------

function streamFor(turn) {
  if (state.stream && state.stream.turn === turn) return state.stream;
  dropStream();
  state.stream = new StreamView(turn, live, { onRender: window.__owRenderProbe || null });
  live.setAttribute("aria-busy", "true");
  return state.stream;
}

function dropStream({ keep = false } = {}) {
  if (!state.stream) return;
  const stream = state.stream;
  stream.finish();
  if (keep && stream.text.source) {
    stream.el.classList.add("incomplete");
    stream.el.classList.remove("streaming");
    stream.el.setAttribute("aria-label", "Assistant (incomplete)");
    items.append(stream.el);
  } else {
    stream.el.remove();
  }
  state.stream = null;
  live.setAttribute("aria-busy", "false");
}

function onDelta(event) {
  const pinned = nearBottom();
  const stream = streamFor(event.turn);
  stream.push(event.text, event.reasoning);
  if (pinned) requestAnimationFrame(() => keepPinned(true));
}

function onMessage(event) {
  const message = event.message || {};
  if (message.role === "assistant" && state.stream && state.stream.turn === event.turn) dropStream();
  if (renderedSeqs().has(message.seq)) return; // already on the page (a reload mid-turn)
  catchUp();
}

// --- turns ---------------------------------------------------------------------------------

function setRunning(turn) {
  state.activeTurn = turn;
  stopButton.hidden = !turn;
  sendButton.disabled = Boolean(turn) || state.sending;
  if (turn) for (const footer of document.querySelectorAll("[data-turn-footer]")) footer.querySelector("[data-action=retry]")?.remove();
}

// Seconds left before a rate-limited turn may be retried: the Retry button waits.
function startCountdown(footer) {
  const counter = footer.querySelector("[data-retry-countdown]");
  const retry = footer.querySelector("[data-action=retry]");
  if (!counter) return;
  let left = Number(counter.dataset.retryCountdown);
  if (retry) retry.disabled = true;
  const tick = () => {
    if (!footer.isConnected) return;
    if (left <= 0) {
      counter.textContent = "You can retry now.";
      if (retry) retry.disabled = false;
      return;
    }
    counter.textContent = `You can retry in ${left} s.`;
    left -= 1;
    setTimeout(tick, 1000);
  };
  tick();
}

// How a turn ended, in the server's words (the same partial as after a reload).
async function turnFooter(turn) {
  let body;
  try {
    const response = await fetch(`${data.sessionUrl}turns/${encodeURIComponent(turn)}/footer`, { credentials: "same-origin" });
    if (!response.ok) return;
    body = await response.json();
  } catch {
    return;
  }
  if (body.active) return;
  document.querySelector(`[data-turn-footer="${CSS.escape(turn)}"]`)?.remove();
  const pinned = nearBottom();
  const holder = document.createElement("div");
  holder.innerHTML = body.html; // server-rendered, autoescaped template
  const footer = holder.firstElementChild;
  if (!footer) return;
  // The streamed bubble already shows what had arrived; the footer's copy is for reloads.
  if (items.querySelector(".msg.incomplete")) footer.querySelector("details.partial")?.remove();
  hydrate(footer);
  items.append(footer);
  startCountdown(footer);
  keepPinned(pinned);
}

function onStatus(event) {
  const info = turnState(event.turn);
  info.status = event.status;
  if (ACTIVE.has(event.status)) {
    if (event.status === "running") clearErrors();
    setRunning(event.turn);
    if (event.status === "awaiting_approval") dropStream({ keep: false });
    return;
  }
  dropStream({ keep: RETRYABLE.has(event.status) });
  clearApprovals(event.turn);
  if (state.activeTurn === event.turn) setRunning(null);
  catchUp().then(() => turnFooter(event.turn));
  files.refresh();
}

function onUsage(event) {
  if (typeof event.context_tokens === "number") {
    state.contextTokens = event.context_tokens;
    updateContextMeter();
  }
  const info = turnState(event.turn);
  if (event.cost === null || event.cost === undefined) {
    info.costUnknown = true;
    state.sessionCost = null;
  } else {
    info.cost += Number(event.cost);
    if (state.sessionCost !== null) state.sessionCost += Number(event.cost);
  }
  updateSessionCost();
}

// --- compaction ------------------------------------------------------------------------------

// A live checkpoint: its summary rendered as Markdown, as after a reload.
function showCheckpoint(checkpoint) {
  const summary = el("summary", { text: "Earlier messages were summarised for the model" });
  const aside = el("aside", { className: "checkpoint", "aria-label": "Compaction checkpoint", dataset: { boundary: String(checkpoint.boundary_seq) } }, [
    el("details", {}, [summary, el("div", { className: "markdown", dataset: { markdown: checkpoint.summary || "" } })]),
  ]);
  hydrate(aside);
  const boundary = items.querySelector(`[data-seq="${Number(checkpoint.boundary_seq)}"]`);
  if (boundary) boundary.before(aside);
  else items.append(aside);
}

// --- tool approvals --------------------------------------------------------------------------

function showApprovals(turn, calls) {
  for (const call of calls) {
    if (approvals.querySelector(`[data-call-id="${CSS.escape(call.id)}"]`)) continue;
    const args = JSON.stringify(call.arguments, null, 2);
    const card = el("section", { className: "approval-card", dataset: { callId: call.id, turn }, "aria-label": `Approve tool call ${call.name}` }, [
      el("p", {}, [el("strong", { text: call.name }), document.createTextNode(" wants to run with:")]),
      el("pre", { className: "tool-args", text: args }),
      el("div", { className: "approval-actions" }, [
        el("button", { type: "button", className: "primary", text: "Approve", dataset: { action: "approve", turn, callId: call.id } }),
        el("button", { type: "button", className: "secondary", text: "Deny", dataset: { action: "deny", turn, callId: call.id } }),
      ]),
    ]);
    approvals.append(card);
  }
  approvals.hidden = !approvals.children.length;
  approvals.querySelector("button")?.focus();
}

function clearApprovals(turn) {
  for (const card of [...approvals.children]) if (!turn || card.dataset.turn === turn) card.remove();
  approvals.hidden = !approvals.children.length;
}

// --- socket --------------------------------------------------------------------------------

function onEvent(event) {
  if (event.turn && typeof event.seq === "number") {
    const info = turnState(event.turn);
    if (event.seq <= info.lastSeq) return; // seen before this reconnect
    info.lastSeq = event.seq;
  }
  switch (event.type) {
    case "hello":
      for (const turn of event.turns) {
        turnState(turn.turn).status = turn.status;
        setRunning(turn.turn);
        if (turn.pending && turn.pending.length) showApprovals(turn.turn, turn.pending);
      }
      if (state.activeTurn && !event.turns.some((t) => t.turn === state.activeTurn)) {
        // The turn ended while the socket was down: show its outcome as a reload would.
        const ended = state.activeTurn;
        const interrupted = state.stream && state.stream.turn === ended;
        dropStream({ keep: Boolean(interrupted) });
        setRunning(null);
        catchUp().then(() => turnFooter(ended));
      } else {
        catchUp();
      }
      break;
    case "turn.status":
      onStatus(event);
      break;
    case "delta":
      onDelta(event);
      break;
    case "message":
      onMessage(event);
      break;
    case "tool.started": {
      const status = items.querySelector(`.tool-card[data-call-id="${CSS.escape(event.call_id)}"] [data-tool-status]`);
      if (status) status.textContent = "running…";
      break;
    }
    case "tool.approval":
      showApprovals(event.turn, event.calls || []);
      break;
    case "usage":
      onUsage(event);
      break;
    case "compaction":
      showCheckpoint(event.checkpoint || {});
      break;
    case "notice":
      modelNote.textContent = String(event.note || "").replace(/^\s*—\s*/, "").replace(/ — /g, "; ");
      break;
    case "message.user":
      if (state.sending) resetComposer();
      catchUp();
      break;
    case "session.title":
      sidebar.setTitle(data.session, String(event.title || ""));
      break;
    case "error":
      state.sending = false;
      sendButton.disabled = Boolean(state.activeTurn);
      showConnection(event.error);
      break;
    default:
      break; // unknown types are ignored: newer servers may add some
  }
}

const socket = new SessionSocket(data.socket, {
  onEvent,
  onStatus(status, wait) {
    // The socket's state as data (open, reconnecting, signed-out, closed): for styling,
    // and for browser tests that must not type into a page whose socket is not open yet.
    connection.dataset.state = status;
    if (status === "open") showConnection("");
    else if (status === "reconnecting") showConnection(wait > 0 ? "Connection lost; reconnecting…" : "");
    else if (status === "signed-out") showConnection("You were signed out. Sign in again to continue.");
    else showConnection("This session is not available.");
  },
  resumePositions() {
    return Object.fromEntries([...state.turns].map(([turn, info]) => [turn, info.lastSeq]));
  },
});

// --- composer and attachments ---------------------------------------------------------------

function resetComposer() {
  state.sending = false;
  textarea.value = "";
  for (const item of state.attachments) if (item.preview) URL.revokeObjectURL(item.preview);
  state.attachments = [];
  renderAttachments();
  sendButton.disabled = Boolean(state.activeTurn);
}

function renderAttachments() {
  pendingList.replaceChildren(
    ...state.attachments.map((item, index) =>
      el("li", { className: "pending" }, [
        item.preview ? el("img", { src: item.preview, alt: "", className: "thumb" }) : null,
        el("span", { text: item.name }),
        el("button", { type: "button", className: "link", text: "Remove", "aria-label": `Remove ${item.name}`, dataset: { action: "remove-attachment", index: String(index) } }),
      ]),
    ),
  );
  const warnings = [];
  const caps = state.caps || {};
  if (state.attachments.some((a) => a.mime.startsWith("image/")) && caps.vision !== true) {
    warnings.push("This model can't see images: they are replaced by a placeholder.");
  }
  if (state.attachments.some((a) => a.mime === "application/pdf") && caps.pdf !== true) {
    warnings.push("This model can't read PDFs directly: their extracted text is sent instead.");
  }
  attachmentWarning.textContent = warnings.join(" ");
  attachmentWarning.hidden = !warnings.length;
}

async function upload(file) {
  if (file.size > data.maxAttachmentBytes) {
    showConnection(`${file.name} is too large.`);
    return;
  }
  const form = new FormData();
  form.append("file", file);
  const response = await fetch(data.uploadUrl, {
    method: "POST",
    body: form,
    credentials: "same-origin",
    headers: { "X-CSRFToken": csrf },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    showConnection(body.error || `Could not attach ${file.name}.`);
    return;
  }
  const preview = body.mime.startsWith("image/") ? URL.createObjectURL(file) : null;
  state.attachments.push({ ...body, preview });
  renderAttachments();
}

async function uploadAll(files) {
  for (const file of files) await upload(file);
}

composer.addEventListener("submit", (submit) => {
  submit.preventDefault();
  const text = textarea.value.trim();
  if (!text && !state.attachments.length) return;
  if (state.activeTurn) return;
  const sent = socket.send({
    type: "send",
    text,
    attachments: state.attachments.map((a) => a.id),
    model: state.model,
  });
  if (!sent) {
    showConnection("Not connected; your message was not sent.");
    return;
  }
  state.sending = true;
  sendButton.disabled = true;
  clearErrors();
});

textarea.addEventListener("keydown", (key) => {
  if (key.key === "Enter" && !key.shiftKey && !key.isComposing) {
    key.preventDefault();
    composer.requestSubmit();
  }
});

$("[data-file-input]").addEventListener("change", (change) => {
  uploadAll([...change.target.files]);
  change.target.value = "";
});

composer.addEventListener("dragover", (drag) => {
  drag.preventDefault();
  composer.classList.add("dropping");
});
composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
composer.addEventListener("drop", (drop) => {
  drop.preventDefault();
  composer.classList.remove("dropping");
  uploadAll([...drop.dataTransfer.files]);
});

// --- buttons (event delegation: server-rendered and live elements alike) ---------------------

document.addEventListener("click", (click) => {
  const button = click.target.closest("button[data-action]");
  if (!button) return;
  const { action, turn, callId, index } = button.dataset;
  if (action === "load-earlier") loadEarlier(button);
  else if (action === "stop" && state.activeTurn) socket.send({ type: "stop", turn: state.activeTurn });
  else if (action === "retry") {
    if (socket.send({ type: "retry", turn })) {
      clearErrors();
      button.closest("[data-turn-footer]")?.remove();
      items.querySelector(".msg.incomplete")?.remove();
    }
  } else if (action === "copy-code") {
    copyText(button, button.closest(".code-block")?.querySelector("code")?.textContent || "");
  } else if (action === "copy-message") {
    copyText(button, button.closest(".msg")?.querySelector("[data-markdown]")?.dataset.markdown || "");
  } else if (action === "approve" || action === "deny") {
    if (socket.send({ type: action, turn, call_id: callId })) {
      button.closest(".approval-card")?.remove();
      approvals.hidden = !approvals.children.length;
    }
  } else if (action === "remove-attachment") {
    const [removed] = state.attachments.splice(Number(index), 1);
    if (removed && removed.preview) URL.revokeObjectURL(removed.preview);
    renderAttachments();
  }
});

async function copyText(button, text) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => {
    button.textContent = "Copy";
  }, 1500);
}

// Esc stops the streaming reply (unless a field or menu is using Esc itself).
document.addEventListener("keydown", (key) => {
  if (key.key !== "Escape" || !state.activeTurn || key.defaultPrevented) return;
  if (document.body.classList.contains("drawer-open")) return;
  if (document.activeElement && document.activeElement.closest(".rename-form, [data-search-input]")) return;
  key.preventDefault();
  socket.send({ type: "stop", turn: state.activeTurn });
});

// --- model switching -------------------------------------------------------------------------

modelForm.addEventListener("submit", async (submit) => {
  submit.preventDefault();
  const model = pickerValue(modelForm);
  if (!model) return;
  const response = await fetch(modelForm.action, {
    method: "POST",
    body: new FormData(modelForm),
    credentials: "same-origin",
    headers: { "X-CSRFToken": csrf },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    modelNote.textContent = body.error || "Could not switch the model.";
    return;
  }
  state.model = body.model;
  state.caps = body.caps;
  const parts = [`Now using ${body.model} (${body.caps_label}).`];
  if (!body.caps.curated) parts.push("Capabilities unknown: not a curated model.");
  if (body.note) parts.push(body.note);
  modelNote.textContent = parts.join(" ");
  updateContextMeter();
  renderAttachments();
  $("[data-no-key]")?.remove();
});

// --- start ---------------------------------------------------------------------------------

const sidebar = new Sidebar($("[data-sidebar]"), { currentSession: data.session, searchUrl: data.searchUrl, onStatus: showConnection });
const files = new FilesPanel($("[data-files-panel]"), data.filesUrl);

// Picking a curated model switches to it at once (the button stays for a custom id).
initPickers(document, (root) => {
  if (root.closest("[data-model-form]") && pickerValue(root) && root.querySelector("[data-picker-select]").value !== "__custom__") {
    modelForm.requestSubmit();
  }
});
hydrate(document);
for (const footer of items.querySelectorAll("[data-turn-footer]")) startCountdown(footer);
updateContextMeter();
updateSessionCost();
if (data.lastTurn) turnState(data.lastTurn.id).status = data.lastTurn.status;
scroller.scrollTop = scroller.scrollHeight;
socket.connect();
window.addEventListener("online", () => socket.retryNow());
