// The model picker in the chat header: picking a curated model switches to it at once (the
// Switch button stays for a custom id); the note says what the new model can do.

import { renderAttachments } from "./composer.js";
import { updateContextMeter } from "./meters.js";
import { $, csrf, state, ui } from "./page.js";
import { initPickers, pickerValue } from "./picker.js";

export function initModelBar() {
  const { modelForm, modelNote } = ui;
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
    // The custom option names the model in use, as the page does when it is loaded.
    const select = modelForm.querySelector("[data-picker-select]");
    const customOption = select?.querySelector('option[value="__custom__"]');
    if (customOption) {
      customOption.textContent = select.value === "__custom__" ? `Custom: ${body.model}` : "Custom model…";
    }
    updateContextMeter();
    renderAttachments();
    $("[data-no-key]")?.remove();
  });

  initPickers(document, (root) => {
    if (root.closest("[data-model-form]") && pickerValue(root) && root.querySelector("[data-picker-select]").value !== "__custom__") {
      modelForm.requestSubmit();
    }
  });
}
