// The composer: the message box (Enter sends, Shift+Enter a new line), attachments
// (picked, dropped, uploaded at once and listed with a warning when the model cannot read
// them), and Send. The socket's `send` is given by chat.js.

import { $, clearErrors, csrf, data, el, showConnection, state, ui } from "./page.js";

export function resetComposer() {
  state.sending = false;
  ui.textarea.value = "";
  for (const item of state.attachments) if (item.preview) URL.revokeObjectURL(item.preview);
  state.attachments = [];
  renderAttachments();
  ui.sendButton.disabled = Boolean(state.activeTurn);
}

// The socket refused what was sent (an `error` event): Send is usable again.
export function sendRefused() {
  state.sending = false;
  ui.sendButton.disabled = Boolean(state.activeTurn);
}

export function renderAttachments() {
  ui.pendingList.replaceChildren(
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
  ui.attachmentWarning.textContent = warnings.join(" ");
  ui.attachmentWarning.hidden = !warnings.length;
}

export function removeAttachment(index) {
  const [removed] = state.attachments.splice(Number(index), 1);
  if (removed && removed.preview) URL.revokeObjectURL(removed.preview);
  renderAttachments();
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

export function initComposer(send) {
  const { composer, textarea, sendButton } = ui;
  composer.addEventListener("submit", (submit) => {
    submit.preventDefault();
    const text = textarea.value.trim();
    if (!text && !state.attachments.length) return;
    if (state.activeTurn) return;
    const sent = send({
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
}
