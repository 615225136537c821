// The chat page, wired: the socket (docs/PROTOCOL.md) brings live events, and this module
// routes each to the part of the page it concerns. One module per concern:
//   page.js        shared page data, elements, state and DOM helpers
//   transcript.js  committed messages (server HTML + Markdown source), load earlier
//   turns.js       the streaming reply, Stop, a turn's footer (Retry, countdown)
//   composer.js    the message box, attachments, Send
//   approvals.js   tool calls waiting for a decision
//   meters.js      context meter and session cost
//   model_bar.js   the model picker in the header
//   branches.js    edit, regenerate, "‹ 2 / 3 ›" branches, continue (the transcript as a tree)
// with renderer.js / stream.js (Markdown, live and stored), socket.js, sidebar.js,
// files.js and picker.js below them.
//
// Nothing the model or a tool produces is ever inserted as markup unsanitised: Markdown
// goes through renderer.js (DOMPurify), server HTML is sanitised by the server, and
// everything else goes through textContent.

import { decide, showApprovals } from "./approvals.js";
import { branchRefused, handles, initBranches, onBranch, onControl, onHello } from "./branches.js";
import { initComposer, removeAttachment, resetComposer, sendRefused } from "./composer.js";
import { FilesPanel } from "./files.js";
import { onUsage, updateContextMeter, updateSessionCost } from "./meters.js";
import { initModelBar } from "./model_bar.js";
import { $, data, showConnection, state, turnState, ui } from "./page.js";
import { hydrate } from "./renderer.js";
import { Sidebar } from "./sidebar.js";
import { SessionSocket } from "./socket.js";
import { catchUp, loadEarlier, markToolRunning, showCheckpoint } from "./transcript.js";
import { endedWhileAway, onDelta, onMessage, onStatus, onTurnEnded, retry, setRunning, startCountdown } from "./turns.js";

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
        endedWhileAway(state.activeTurn);
      } else {
        catchUp();
      }
      onHello(event);
      break;
    case "turn.queued": // the worker is busy: the turn waits its place (issue 26)
      setRunning(event.turn);
      showConnection(`Waiting for a worker… position ${Number(event.position) || 1} in the queue`, "waiting");
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
    case "tool.started":
      markToolRunning(event.call_id);
      break;
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
      ui.modelNote.textContent = String(event.note || "").replace(/^\s*—\s*/, "").replace(/ — /g, "; ");
      break;
    case "message.user":
      if (state.sending) resetComposer();
      catchUp();
      break;
    case "session.title":
      sidebar.setTitle(data.session, String(event.title || ""));
      break;
    case "session.branch":
      onBranch(event);
      break;
    case "error":
      sendRefused();
      if (!branchRefused(event.error)) showConnection(event.error);
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
    ui.connection.dataset.state = status;
    if (status === "open") showConnection("");
    else if (status === "reconnecting") showConnection(wait > 0 ? "Connection lost; reconnecting…" : "");
    else if (status === "signed-out") showConnection("You were signed out. Sign in again to continue.");
    else showConnection("This session is not available.");
  },
  resumePositions() {
    return Object.fromEntries([...state.turns].map(([turn, info]) => [turn, info.lastSeq]));
  },
});
const send = (message) => socket.send(message);

// --- buttons (event delegation: server-rendered and live elements alike) ---------------------

document.addEventListener("click", (click) => {
  const button = click.target.closest("button[data-action]");
  if (!button) return;
  const { action, index } = button.dataset;
  if (action === "load-earlier") loadEarlier(button);
  else if (action === "stop" && state.activeTurn) send({ type: "stop", turn: state.activeTurn });
  else if (action === "retry") retry(button, send);
  else if (action === "copy-code") {
    copyText(button, button.closest(".code-block")?.querySelector("code")?.textContent || "");
  } else if (action === "copy-message") {
    copyText(button, button.closest(".msg")?.querySelector("[data-markdown]")?.dataset.markdown || "");
  } else if (action === "approve" || action === "deny") decide(button, send);
  else if (action === "remove-attachment") removeAttachment(index);
  else if (handles(action)) onControl(button);
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
  if (document.body.classList.contains("drawer-open") || document.querySelector("dialog[open]")) return;
  if (document.activeElement && document.activeElement.closest(".rename-form, [data-search-input]")) return;
  key.preventDefault();
  send({ type: "stop", turn: state.activeTurn });
});

// --- start ---------------------------------------------------------------------------------

initComposer(send);
// A redrawn path may carry turn footers (a rate-limited one counts down again), and
// messages committed while it was fetched follow it.
initBranches({
  send,
  onPath: () => {
    ui.items.querySelectorAll("[data-turn-footer]").forEach(startCountdown);
    catchUp();
  },
});
const sidebar = new Sidebar($("[data-sidebar]"), { currentSession: data.session, searchUrl: data.searchUrl, onStatus: showConnection });
const files = new FilesPanel($("[data-files-panel]"), data.filesUrl);
onTurnEnded(() => files.refresh());
initModelBar();
hydrate(document);
for (const footer of ui.items.querySelectorAll("[data-turn-footer]")) startCountdown(footer);
updateContextMeter();
updateSessionCost();
if (data.lastTurn) turnState(data.lastTurn.id).status = data.lastTurn.status;
ui.scroller.scrollTop = ui.scroller.scrollHeight;
socket.connect();
window.addEventListener("online", () => socket.retryNow());
