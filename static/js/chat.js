// The chat page: committed messages come rendered from the server (the same renderer for
// stored and live messages); the socket (docs/PROTOCOL.md) brings live events. Streamed
// text is shown as escaped text (textContent) until its message is committed, then
// replaced by the server-rendered HTML of that message, fetched by seq.
//
// Nothing the model or a tool produces is ever inserted as markup here: only the server's
// sanitised HTML is, and everything else goes through textContent.

import { initPickers, pickerValue } from "./picker.js";
import { SessionSocket } from "./socket.js";

const data = JSON.parse(document.getElementById("page-data").textContent);
const $ = (selector, root = document) => root.querySelector(selector);
const csrf = $("[data-composer] input[name=csrfmiddlewaretoken]").value;

const transcript = $("#transcript");
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
  const scroller = document.scrollingElement;
  return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < STICKY_SCROLL_PX;
}

function keepPinned(wasNearBottom) {
  if (wasNearBottom) window.scrollTo({ top: document.scrollingElement.scrollHeight });
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
    const scroller = document.scrollingElement;
    const fromBottom = scroller.scrollHeight - scroller.scrollTop;
    items.insertAdjacentHTML("afterbegin", body.html);
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
  const reasoningBody = el("div", { className: "streamed-reasoning" });
  const reasoning = el("details", { className: "reasoning", hidden: true }, [
    el("summary", { text: "Reasoning" }),
    reasoningBody,
  ]);
  const text = el("div", { className: "msg-body streamed-text" });
  const bubble = el("article", { className: "msg msg-assistant streaming", "aria-label": "Assistant (writing)" }, [
    el("p", { className: "msg-who", text: "Assistant" }),
    reasoning,
    text,
  ]);
  live.append(bubble);
  live.setAttribute("aria-busy", "true");
  state.stream = { turn, el: bubble, text, reasoning, reasoningBody };
  return state.stream;
}

function dropStream({ keep = false } = {}) {
  if (!state.stream) return;
  if (keep && state.stream.text.textContent) {
    state.stream.el.classList.add("incomplete");
    state.stream.el.setAttribute("aria-label", "Assistant (incomplete)");
    items.append(state.stream.el);
  } else {
    state.stream.el.remove();
  }
  state.stream = null;
  live.setAttribute("aria-busy", "false");
}

function onDelta(event) {
  const pinned = nearBottom();
  const stream = streamFor(event.turn);
  if (event.reasoning) {
    stream.reasoning.hidden = false;
    stream.reasoningBody.append(document.createTextNode(event.reasoning));
  }
  if (event.text) stream.text.append(document.createTextNode(event.text));
  keepPinned(pinned);
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

function turnFooter(turn, status, error) {
  document.querySelector(`[data-turn-footer="${CSS.escape(turn)}"]`)?.remove();
  const info = turnState(turn);
  const children = [];
  if (RETRYABLE.has(status)) children.push(el("p", { className: "error", role: "alert", text: error || "This reply did not finish." }));
  else if (status === "cancelled") children.push(el("p", { className: "meta", text: "Stopped." }));
  else if (error) children.push(el("p", { className: "meta", text: error }));
  const cost = info.costUnknown ? null : formatCost(info.cost);
  if (cost && info.cost > 0) children.push(el("span", { className: "meta cost", text: `Reply cost ${cost}` }));
  if (RETRYABLE.has(status)) {
    children.push(el("button", { type: "button", className: "secondary", text: "Retry", dataset: { action: "retry", turn } }));
  }
  if (!children.length) return;
  const footer = el("div", { className: `turn-footer status-${status}`, dataset: { turnFooter: turn } }, children);
  items.append(footer);
}

function onStatus(event) {
  const info = turnState(event.turn);
  info.status = event.status;
  if (ACTIVE.has(event.status)) {
    setRunning(event.turn);
    if (event.status === "awaiting_approval") dropStream({ keep: false });
    return;
  }
  dropStream({ keep: RETRYABLE.has(event.status) });
  clearApprovals(event.turn);
  if (state.activeTurn === event.turn) setRunning(null);
  catchUp().then(() => turnFooter(event.turn, event.status, event.error));
  if (RETRYABLE.has(event.status)) showConnection(event.error || "The reply did not finish.");
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

// A live checkpoint: the summary is shown as plain text until the next page load renders it
// (as Markdown) from the database.
function showCheckpoint(checkpoint) {
  const summary = el("summary", { text: "Earlier messages were summarised for the model" });
  const aside = el("aside", { className: "checkpoint", "aria-label": "Compaction checkpoint", dataset: { boundary: String(checkpoint.boundary_seq) } }, [
    el("details", {}, [summary, el("div", { className: "streamed-text", text: checkpoint.summary || "" })]),
  ]);
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
      if (!event.turns.length && state.activeTurn) {
        // The turn ended while the socket was down: the transcript has its outcome.
        dropStream();
        setRunning(null);
      }
      catchUp();
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
    else if (status === "reconnecting") showConnection(`Connection lost; reconnecting in ${Math.ceil(wait / 1000)} s…`);
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
    if (socket.send({ type: "retry", turn })) button.closest("[data-turn-footer]")?.remove();
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
});

// --- start ---------------------------------------------------------------------------------

initPickers(document);
updateContextMeter();
updateSessionCost();
if (data.lastTurn) turnState(data.lastTurn.id).status = data.lastTurn.status;
window.scrollTo({ top: document.scrollingElement.scrollHeight });
socket.connect();
