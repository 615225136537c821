// The model picker: a curated model (labelled with what it can do) or a custom model id,
// which shows a visible "capabilities unknown" warning. Plain ES module, no build step.

const CUSTOM = "__custom__";

export function pickerValue(root) {
  const select = root.querySelector("[data-picker-select]");
  if (!select) return "";
  if (select.value === CUSTOM) {
    return root.querySelector("[data-picker-custom] input").value.trim();
  }
  return select.value;
}

function sync(root) {
  const select = root.querySelector("[data-picker-select]");
  const custom = root.querySelector("[data-picker-custom]");
  const caps = root.querySelector("[data-picker-caps]");
  const isCustom = select.value === CUSTOM;
  custom.hidden = !isCustom;
  custom.querySelector("input").required = isCustom;
  const option = select.selectedOptions[0];
  caps.textContent = isCustom ? "" : option && option.dataset.caps ? `Can do: ${option.dataset.caps}` : "";
}

export function initPickers(scope = document, onChange = null) {
  for (const root of scope.querySelectorAll("[data-picker]")) {
    const select = root.querySelector("[data-picker-select]");
    sync(root);
    select.addEventListener("change", () => {
      sync(root);
      if (select.value === CUSTOM) {
        root.dataset.open = "";
        root.querySelector("[data-picker-custom] input").focus();
      }
      if (onChange) onChange(root);
    });
    // `data-open` while the user is in the picker (the header shows its custom-model box
    // only then: left open it lay over the transcript).
    root.addEventListener("focusin", () => { root.dataset.open = ""; });
    root.addEventListener("focusout", (event) => {
      if (!root.contains(event.relatedTarget)) delete root.dataset.open;
    });
  }
}

// Pages that only need the behaviour (session list, settings) load this module directly.
if (!document.getElementById("page-data")) initPickers();
