// The reply being streamed: one bubble whose text and reasoning are rendered as Markdown
// while they arrive (renderer.js, incrementally). Deltas are applied at most once per
// animation frame: several socket frames in one frame cost one render.

import { LiveMarkdown } from "./renderer.js";

function el(tag, className, attrs = {}) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

export class StreamView {
  constructor(turn, live, { onRender = null } = {}) {
    this.turn = turn;
    this.onRender = onRender;
    this.reasoningBody = el("div", "markdown streamed-reasoning");
    this.reasoning = el("details", "reasoning");
    this.reasoning.hidden = true;
    const summary = el("summary");
    summary.textContent = "Reasoning";
    this.reasoning.append(summary, this.reasoningBody);
    this.body = el("div", "msg-body markdown streamed-text");
    const who = el("p", "msg-who");
    who.textContent = "Assistant";
    this.el = el("article", "msg msg-assistant streaming", { "aria-label": "Assistant (writing)" });
    this.el.append(who, this.reasoning, this.body);
    this.text = new LiveMarkdown(this.body);
    this.thinking = new LiveMarkdown(this.reasoningBody);
    this.pendingText = "";
    this.pendingReasoning = "";
    this.frame = 0;
    live.append(this.el);
  }

  get source() {
    return this.text.source + this.pendingText;
  }

  push(text, reasoning) {
    if (text) this.pendingText += text;
    if (reasoning) this.pendingReasoning += reasoning;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  // Apply what arrived since the last frame (also called before the bubble is kept).
  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (!this.pendingText && !this.pendingReasoning) return;
    const started = performance.now();
    if (this.pendingReasoning) {
      this.reasoning.hidden = false;
      this.thinking.append(this.pendingReasoning);
    }
    if (this.pendingText) this.text.append(this.pendingText);
    this.pendingText = "";
    this.pendingReasoning = "";
    if (this.onRender) this.onRender(performance.now() - started, this.text.source.length);
  }

  finish() {
    this.flush();
    this.text.finish();
    this.thinking.finish();
  }
}
