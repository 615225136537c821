// The context meter and the session's cost, in the chat header. The meter is hidden when
// the model's context window is unknown; the cost when a price is unknown or nothing was spent.

import { $, state, turnState } from "./page.js";

function formatCost(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return null;
  return value >= 1 ? `$${value.toFixed(2)}` : `$${value.toFixed(4)}`;
}

export function updateContextMeter() {
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

export function updateSessionCost() {
  const box = $("[data-session-cost]");
  const text = formatCost(state.sessionCost);
  box.hidden = text === null || state.sessionCost === 0;
  $("[data-session-cost-value]", box).textContent = text || "";
}

// A `usage` event: after each model call.
export function onUsage(event) {
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
