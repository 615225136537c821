// A turn's life on the page: the reply streaming into its bubble (stream.js), the Stop
// button while it runs, and how it ended, as the server's footer (the same HTML a reload
// shows: plain words per failure class, Retry, a countdown for `rate_limited`).

import { clearApprovals } from "./approvals.js";
import { updateContinueBar } from "./branches.js";
import { clearErrors, data, keepPinned, nearBottom, state, turnState, ui } from "./page.js";
import { hydrate } from "./renderer.js";
import { StreamView } from "./stream.js";
import { catchUp, renderedSeqs } from "./transcript.js";

export const ACTIVE = new Set(["queued", "running", "awaiting_approval"]);
const RETRYABLE = new Set(["failed", "interrupted"]);

// Called when a turn reaches a final status (the files panel refreshes then).
const hooks = { onEnded: () => {} };

export function onTurnEnded(callback) {
  hooks.onEnded = callback;
}

// --- streaming -----------------------------------------------------------------------------

function streamFor(turn) {
  if (state.stream && state.stream.turn === turn) return state.stream;
  dropStream();
  state.stream = new StreamView(turn, ui.live, { onRender: window.__owRenderProbe || null });
  ui.live.setAttribute("aria-busy", "true");
  return state.stream;
}

export function dropStream({ keep = false } = {}) {
  if (!state.stream) return;
  const stream = state.stream;
  stream.finish();
  if (keep && stream.text.source) {
    stream.el.classList.add("incomplete");
    stream.el.classList.remove("streaming");
    stream.el.setAttribute("aria-label", "Assistant (incomplete)");
    ui.items.append(stream.el);
  } else {
    stream.el.remove();
  }
  state.stream = null;
  ui.live.setAttribute("aria-busy", "false");
}

export function onDelta(event) {
  const pinned = nearBottom();
  const stream = streamFor(event.turn);
  stream.push(event.text, event.reasoning);
  if (pinned) requestAnimationFrame(() => keepPinned(true));
}

export function onMessage(event) {
  const message = event.message || {};
  if (message.role === "assistant" && state.stream && state.stream.turn === event.turn) dropStream();
  if (renderedSeqs().has(message.seq)) return; // already on the page (a reload mid-turn)
  catchUp();
}

// --- running and ended ---------------------------------------------------------------------

export function setRunning(turn) {
  state.activeTurn = turn;
  ui.stopButton.hidden = !turn;
  ui.sendButton.disabled = Boolean(turn) || state.sending;
  if (turn) for (const footer of document.querySelectorAll("[data-turn-footer]")) footer.querySelector("[data-action=retry]")?.remove();
  updateContinueBar();
}

// Seconds left before a rate-limited turn may be retried: the Retry button waits.
export function startCountdown(footer) {
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
export async function turnFooter(turn) {
  const { items } = ui;
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

export function onStatus(event) {
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
  hooks.onEnded(event.turn);
}

// `hello` without the turn the page was following: it ended while the socket was away,
// so its outcome shows as a reload would (the bubble holds only what arrived before the
// drop; the footer's partial or the committed reply has all of it).
export function endedWhileAway(ended) {
  dropStream({ keep: false });
  setRunning(null);
  catchUp().then(() => turnFooter(ended));
}

// The Retry button of a failed turn's footer.
export function retry(button, send) {
  if (send({ type: "retry", turn: button.dataset.turn })) {
    clearErrors();
    button.closest("[data-turn-footer]")?.remove();
    ui.items.querySelector(".msg.incomplete")?.remove();
  }
}
