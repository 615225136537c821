// The transcript as a tree (docs/PROTOCOL.md, *Branches*): Edit on the user's messages
// (an inline editor; Save sends `edit`), Regenerate on replies (the same model or one from
// the dialog's picker), "‹ 2 / 3 ›" on a message with siblings (sends `switch`), Continue
// after Stop or an output-limit finish, and Up-arrow in an empty composer to edit the last
// message. Every one of them only asks the server: the page changes when `session.branch`
// arrives (in every open tab of the session), by rendering the new path from the server.
//
// While a turn streams the server refuses these with an `error`; the page shows it next to
// the control that asked, and keeps what the user typed in an editor.

import { $, clearErrors, data, el, nearBottom, showConnection, state, ui } from "./page.js";
import { hydrate } from "./renderer.js";

// Finish reasons after which a reply can be continued, per provider's words: Stop
// (`cancelled`), Anthropic / Bedrock `max_tokens`, OpenAI `length`, Gemini `MAX_TOKENS`,
// the Responses API's `max_output_tokens`.
const CUT = new Set(["cancelled", "max_tokens", "length", "max_output_tokens"]);

const CONTROLS = new Set(["edit", "cancel-edit", "regenerate", "regenerate-with", "switch", "continue"]);

let send = () => false;
let onPathShown = () => {};
// The control whose command the server has not answered yet: a refusal is shown beside it.
let asking = null;
// After a `switch` from this page, the button to give focus back to once the path is redrawn.
let refocus = null;
let editorCount = 0;
let focusComposer = false;

export function initBranches({ send: sendFrame, onPath }) {
  send = sendFrame;
  onPathShown = onPath;
  state.leaf = typeof data.activeLeaf === "number" ? data.activeLeaf : lastSeq();
  decorate(ui.items);
  ui.textarea.addEventListener("keydown", upArrowEdits);
  const dialog = $("[data-regen-dialog]");
  dialog?.addEventListener("close", () => {
    const target = dialog.dataset.target;
    if (dialog.returnValue === "regenerate" && target) {
      const model = $("[data-regen-model]", dialog).value || state.model;
      const article = articleFor(Number(target));
      ask({ type: "regenerate", message: Number(target), model }, article?.querySelector("[data-action=regenerate-with]") || null);
    }
    articleFor(Number(target))?.querySelector("[data-action=regenerate-with]")?.focus();
  });
}

// --- the path on the page ------------------------------------------------------------------

function articles(root = ui.items) {
  return [...root.querySelectorAll("article.msg[data-seq]")];
}

function lastSeq() {
  const all = articles();
  return all.length ? Number(all[all.length - 1].dataset.seq) : 0;
}

function articleFor(seq) {
  return ui.items.querySelector(`article.msg[data-seq="${Number(seq)}"]`);
}

// The leaf this page shows: sent with every branch command, so the server can tell a tab
// that had not heard of another tab's branch (both succeed) from a stale click.
export function currentLeaf() {
  return state.leaf || lastSeq();
}

// May a committed message from `?after=` join the path shown? Only when it follows its
// last message (its parent): a reply on another branch is not on this path. A page from a
// server without parents (no `data-parent`) takes every message, as before.
export function extendsPath(node) {
  if (!node || !node.hasAttribute || !node.hasAttribute("data-parent")) return true;
  const parent = node.dataset.parent;
  const last = lastSeq();
  return parent === "" ? last === 0 : Number(parent) === last;
}

// What the path needs once messages are in the DOM: continuation rows merged into the
// reply they continue, Regenerate only on a turn's last reply, Continue where a reply was cut.
export function decorate(root = ui.items) {
  for (const node of articles(root)) {
    if (node.dataset.continues) mergeContinuation(node);
  }
  const all = articles();
  all.forEach((node, index) => {
    if (!node.classList.contains("msg-assistant")) return;
    const next = all.slice(index + 1).find((other) => !other.classList.contains("merged"));
    // A tool step's reply is followed by its own turn's messages: regenerate the turn's
    // answer from its last reply, not from every step.
    const lastOfTurn = !next || next.dataset.turn !== node.dataset.turn || next.classList.contains("msg-user");
    for (const button of node.querySelectorAll("[data-action=regenerate], [data-action=regenerate-with]")) button.hidden = !lastOfTurn;
  });
  updateContinueBar();
}

// A continuation written by prefill (`continues` set) extends the cut reply's text: the page
// shows them as one reply, rendered from the joined Markdown source (the renderer sees one
// document, so a code block cut in the middle is still one block).
function mergeContinuation(node) {
  if (node.classList.contains("merged")) return;
  let base = articleFor(node.dataset.continues);
  // A continuation of a continuation: the text joins the reply they all extend.
  while (base && base.classList.contains("merged") && base.dataset.continues) base = articleFor(base.dataset.continues);
  if (!base) return;
  const body = base.querySelector(".msg-body[data-markdown]");
  const more = node.querySelector(".msg-body[data-markdown]");
  if (!body) return;
  if (body.dataset.ownMarkdown === undefined) body.dataset.ownMarkdown = body.dataset.markdown;
  // The prefill went out without its trailing whitespace; the model wrote on from there.
  const joined = body.dataset.markdown.replace(/\s+$/, "") + (more ? more.dataset.markdown : "");
  body.dataset.markdown = joined;
  delete body.dataset.rendered;
  hydrate(base);
  node.classList.add("merged");
  node.hidden = true;
  // "Stopped." under the cut part no longer holds: the reply went on. (Its cost stays.)
  for (let between = base.nextElementSibling; between && between !== node; between = between.nextElementSibling) {
    if (!between.matches("[data-turn-footer].status-cancelled")) continue;
    between.querySelector(":scope > p.meta")?.remove();
    if (!between.querySelector(".cost, button")) between.hidden = true;
  }
  // The merged reply's state is the continuation's: its finish and turn drive Continue.
  base.dataset.continuedBy = node.dataset.seq;
}

export function updateContinueBar() {
  const bar = $("[data-continue-bar]");
  if (!bar) return;
  const all = articles();
  const last = all[all.length - 1];
  const finish = (last?.dataset.finish || "").toLowerCase();
  const cut = !state.activeTurn && !state.sending && last && last.classList.contains("msg-assistant") && CUT.has(finish);
  bar.hidden = !cut;
  if (!cut) return;
  const button = $("[data-action=continue]", bar);
  button.dataset.turn = last.dataset.turn;
  $("[data-continue-why]", bar).textContent = finish === "cancelled" ? "The reply was stopped." : "The reply reached the model's output limit.";
}

// `hello` names the session's active leaf: a tab that was away while another switched
// draws the new path (a page already showing it has nothing to do).
export function onHello(event) {
  if (typeof event.leaf === "number" && event.leaf !== currentLeaf()) onBranch({ leaf: event.leaf });
}

// `session.branch`: the active leaf changed (here or in another tab). Render its path from
// the server; give focus back to where the user was when the change was theirs.
export async function onBranch(event) {
  if (asking) clearRefusal();
  // This page's edit, regenerate or continue: the control that had focus is redrawn
  // away, so focus goes to the composer (a switch keeps it on the arrows instead).
  if (asking && !refocus) focusComposer = true;
  asking = null;
  state.leaf = Number(event.leaf) || 0;
  await showPath(state.leaf);
}

let pathChain = Promise.resolve();
let pathAsked = 0; // the newest redraw asked for: an older one that returns late is dropped

function showPath(leaf) {
  pathAsked += 1;
  const asked = pathAsked;
  pathChain = pathChain.then(() => fetchPath(leaf, asked)).catch(() => {
    showConnection("Could not load this branch; reload the page.");
  });
  return pathChain;
}

async function fetchPath(leaf, asked) {
  if (asked !== pathAsked) return; // a newer branch arrived meanwhile: its redraw follows
  const response = await fetch(`${data.messagesUrl}?leaf=${encodeURIComponent(leaf)}`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  const body = await response.json();
  if (asked !== pathAsked) return;
  const html = typeof body.html === "string" ? body.html : (body.messages || []).map((m) => m.html).join("");
  const pinned = nearBottom();
  // An editor open on a message that stays on the new path keeps what was typed in it.
  const drafts = [...ui.items.querySelectorAll("article.msg.editing")].map((node) => [node.dataset.seq, node.querySelector(".msg-editor textarea")?.value ?? ""]);
  const hadFocus = document.activeElement?.closest(".msg-editor") ? document.activeElement.closest("article.msg")?.dataset.seq : null;
  ui.items.innerHTML = html; // server-rendered, autoescaped and sanitised
  const shown = articles();
  state.firstSeq = typeof body.first_seq === "number" ? body.first_seq : shown.length ? Number(shown[0].dataset.seq) : 0;
  state.hasMore = Boolean(body.has_more ?? body.more);
  $(".load-earlier", ui.transcript).hidden = !state.hasMore;
  hydrate(ui.items);
  decorate(ui.items);
  state.leaf = lastSeq() || leaf;
  // Messages committed while the path was fetched were not on the old path: the caller
  // catches up along the new one.
  onPathShown();
  for (const [seq, text] of drafts) {
    const node = articleFor(seq);
    if (!node) continue;
    openEditor(node, { text, focus: seq === hadFocus });
  }
  if (focusComposer) {
    focusComposer = false;
    ui.textarea.focus();
  }
  if (refocus) {
    const { seq, label } = refocus;
    refocus = null;
    const target = articleFor(seq)?.querySelector(`[data-action=switch][aria-label="${label}"]`);
    (target && !target.disabled ? target : articleFor(seq)?.querySelector("[data-action=switch]:not([disabled])"))?.focus();
  } else if (pinned) {
    ui.scroller.scrollTop = ui.scroller.scrollHeight;
  }
}

// --- asking the server ---------------------------------------------------------------------

function ask(frame, control) {
  clearRefusal();
  if (!send({ ...frame, leaf: currentLeaf() })) {
    refuse(control, "Not connected; try again in a moment.");
    return false;
  }
  asking = control;
  clearErrors();
  return true;
}

function refuse(control, words) {
  const holder = control?.closest(".msg-editor") || control?.closest("article.msg") || control?.closest("[data-continue-bar]");
  if (!holder) {
    showConnection(words);
    return;
  }
  const note = el("p", { className: "branch-refusal", role: "alert", text: words });
  holder.append(note);
}

function clearRefusal() {
  for (const note of document.querySelectorAll(".branch-refusal")) note.remove();
}

// An `error` from the server: true when it answered a branch command of this page (then it
// is shown beside the control that asked, and the composer's line stays as it was).
export function branchRefused(words) {
  if (!asking) return false;
  const control = asking;
  asking = null;
  refuse(control, words);
  return true;
}

// A new turn started or a message was committed: whatever was asked has been answered.
export function settled() {
  asking = null;
}

// --- the controls --------------------------------------------------------------------------

export function handles(action) {
  return CONTROLS.has(action);
}

export function onControl(button) {
  const { action } = button.dataset;
  const article = button.closest("article.msg");
  if (action === "edit") openEditor(article);
  else if (action === "cancel-edit") closeEditor(article, { focus: true });
  else if (action === "regenerate") ask({ type: "regenerate", message: Number(article.dataset.seq), model: state.model }, button);
  else if (action === "regenerate-with") openRegenerateDialog(article);
  else if (action === "switch" && button.dataset.seq) {
    refocus = { seq: Number(button.dataset.seq), label: button.getAttribute("aria-label") };
    if (!ask({ type: "switch", message: Number(button.dataset.seq) }, button)) refocus = null;
  } else if (action === "continue" && button.dataset.turn) ask({ type: "continue", turn: button.dataset.turn }, button);
}

function openRegenerateDialog(article) {
  const dialog = $("[data-regen-dialog]");
  if (!dialog) return;
  dialog.dataset.target = article.dataset.seq;
  dialog.returnValue = "";
  dialog.showModal();
  $("[data-regen-model]", dialog)?.focus();
}

function openEditor(article, { text = null, focus = true } = {}) {
  if (!article) return;
  const open = article.querySelector(".msg-editor textarea");
  if (open) {
    open.focus();
    return;
  }
  const body = article.querySelector(".msg-body[data-markdown]");
  const source = text ?? (body ? body.dataset.markdown : "");
  editorCount += 1;
  const id = `edit-${article.dataset.seq}-${editorCount}`;
  const textarea = el("textarea", { id, rows: String(Math.min(12, Math.max(2, source.split("\n").length + 1))), value: source });
  const form = el("form", { className: "msg-editor", "aria-label": "Edit your message" }, [
    el("label", { for: id, className: "visually-hidden", text: "Edited message" }),
    textarea,
    el("div", { className: "editor-actions" }, [
      el("button", { type: "submit", className: "primary small", text: "Save and send" }),
      el("button", { type: "button", className: "secondary small", text: "Cancel", dataset: { action: "cancel-edit" } }),
    ]),
    el("p", { className: "hint", text: "The original stays: ‹ › switches between the versions. Enter saves, Shift+Enter a new line, Esc cancels." }),
  ]);
  form.addEventListener("submit", (submit) => {
    submit.preventDefault();
    const text = textarea.value.trim();
    const save = form.querySelector("button[type=submit]");
    if (!text && !article.querySelector(".attachments")) {
      refuse(save, "Write something to send.");
      return;
    }
    ask({ type: "edit", message: Number(article.dataset.seq), text, model: state.model }, save);
  });
  textarea.addEventListener("keydown", (key) => {
    if (key.key === "Enter" && !key.shiftKey && !key.isComposing) {
      key.preventDefault();
      form.requestSubmit();
    } else if (key.key === "Escape") {
      key.preventDefault(); // Esc here closes the editor; it does not stop the reply
      closeEditor(article, { focus: true });
    }
  });
  article.classList.add("editing");
  if (body) body.hidden = true;
  const tools = article.querySelector(".msg-tools");
  if (tools) tools.hidden = true;
  (tools || body || article.lastElementChild).after(form);
  if (!focus) return;
  textarea.focus();
  textarea.setSelectionRange(textarea.value.length, textarea.value.length);
}

function closeEditor(article, { focus = false } = {}) {
  if (!article) return;
  article.querySelector(".msg-editor")?.remove();
  article.classList.remove("editing");
  const body = article.querySelector(".msg-body");
  if (body) body.hidden = false;
  const tools = article.querySelector(".msg-tools");
  if (tools) tools.hidden = false;
  if (focus) article.querySelector("[data-action=edit]")?.focus();
}

// Up-arrow in an empty composer edits the last message the user sent on this path.
function upArrowEdits(key) {
  if (key.key !== "ArrowUp" || key.shiftKey || key.altKey || key.ctrlKey || key.metaKey || key.isComposing) return;
  if (ui.textarea.value !== "") return;
  const mine = articles().filter((node) => node.classList.contains("msg-user"));
  const last = mine[mine.length - 1];
  if (!last) return;
  key.preventDefault();
  last.scrollIntoView({ block: "nearest" });
  openEditor(last);
}
