// Tool calls waiting for the user's decision: one card per call, Approve / Deny.

import { el, ui } from "./page.js";

export function showApprovals(turn, calls) {
  const { approvals } = ui;
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

export function clearApprovals(turn) {
  const { approvals } = ui;
  for (const card of [...approvals.children]) if (!turn || card.dataset.turn === turn) card.remove();
  approvals.hidden = !approvals.children.length;
}

// The user decided a call (its button was clicked): `send` is the socket's.
export function decide(button, send) {
  const { action, turn, callId } = button.dataset;
  if (send({ type: action, turn, call_id: callId })) {
    button.closest(".approval-card")?.remove();
    ui.approvals.hidden = !ui.approvals.children.length;
  }
}
