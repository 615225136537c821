// What every part of the chat page shares: the server's page data, the page's elements,
// the mutable state of the conversation, and small DOM helpers. No behaviour of its own:
// the modules that act on these (transcript, turns, composer, ...) import them from here.

export const $ = (selector, root = document) => root.querySelector(selector);

export const data = JSON.parse(document.getElementById("page-data").textContent);
export const csrf = $("[data-composer] input[name=csrfmiddlewaretoken]").value;

const transcript = $("#transcript");
export const ui = {
  transcript,
  // The chat column scrolls (the sidebar and composer stay put), not the document.
  scroller: $("main.chat") || document.scrollingElement,
  items: $("[data-items]", transcript),
  live: $("[data-live]", transcript),
  approvals: $("[data-approvals]"),
  connection: $("[data-connection]"),
  composer: $("[data-composer]"),
  textarea: $("[data-composer-text]"),
  sendButton: $("[data-send]"),
  stopButton: $("[data-action=stop]"),
  pendingList: $("[data-pending-attachments]"),
  attachmentWarning: $("[data-attachment-warning]"),
  modelForm: $("[data-model-form]"),
  modelNote: $("[data-model-note]"),
};

export const state = {
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
  leaf: null, // the active leaf shown (branches.js): the last message of the path on the page
};

// Nearer the bottom than this (px), new content keeps the view pinned to the bottom.
const STICKY_SCROLL_PX = 120;

export function el(tag, props = {}, children = []) {
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

export function nearBottom() {
  const { scroller } = ui;
  return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < STICKY_SCROLL_PX;
}

export function keepPinned(wasNearBottom) {
  if (wasNearBottom) ui.scroller.scrollTop = ui.scroller.scrollHeight;
}

export function turnState(turn) {
  if (!state.turns.has(turn)) state.turns.set(turn, { lastSeq: 0, status: null, cost: 0, costUnknown: false });
  return state.turns.get(turn);
}

// `kind` "waiting" (a queued turn): shown as information, not as an error.
export function showConnection(text, kind = "") {
  ui.connection.textContent = text;
  if (kind && text) ui.connection.dataset.kind = kind;
  else delete ui.connection.dataset.kind;
}

// A new attempt starts (send, retry, a running status): last attempt's errors go at once.
export function clearErrors() {
  showConnection("");
  for (const footer of ui.items.querySelectorAll("[data-turn-footer]")) {
    if (footer.querySelector(".error")) footer.remove();
  }
}
