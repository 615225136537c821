// The one Markdown renderer of the page, for streamed and stored text alike.
//
// markdown-it (CommonMark + tables + strikethrough, raw HTML escaped) parses; highlight.js
// colours fenced code with classes only (the CSP forbids inline styles); KaTeX turns $…$
// and $$…$$ into MathML (no stylesheet or fonts needed); DOMPurify sanitises every
// fragment against an allow-list before it touches the document. Remote images are never
// loaded (a beacon would tell a third party the transcript was opened), as on the server
// (sessions/markdown.py, the no-script fallback).
//
// Streaming is incremental: `LiveMarkdown` keeps the finished top-level blocks as DOM and
// re-parses only the open tail block per update, so an update costs the size of the last
// block, not of the reply. A stored message is rendered by the same `LiveMarkdown`, fed
// the whole text at once, so a reply looks the same while it streams and after a reload.

import MarkdownIt from "../vendor/markdown-it/markdown-it.esm.min.mjs";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import hljs from "../vendor/highlightjs/highlight.min.mjs";
import katex from "../vendor/katex/katex.mjs";

// Highlighting is linear but not free: a pasted log of megabytes is shown plain.
const MAX_HIGHLIGHT_CHARS = 100_000;
// A language tag is a short word ("python", "c++"); a longer info string is not a language.
const MAX_LANG_CHARS = 40;
// KaTeX limits: no macro bombs, no giant boxes from hostile input.
const KATEX_OPTIONS = { output: "mathml", throwOnError: false, trust: false, strict: "ignore", maxSize: 50, maxExpand: 1000 };
const SAFE_DATA_IMAGE = /^data:image\/(png|jpeg|gif|webp);/i;
const LINK_REL = "noopener noreferrer nofollow";

const HTML_TAGS = [
  "a", "p", "br", "hr", "em", "strong", "del", "s", "code", "pre", "span", "div",
  "blockquote", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
  "table", "thead", "tbody", "tr", "th", "td", "img",
];
// Presentation MathML as KaTeX writes it (Chromium renders it natively).
const MATH_TAGS = [
  "math", "semantics", "annotation", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace",
  "msup", "msub", "msubsup", "mfrac", "msqrt", "mroot", "mover", "munder", "munderover",
  "mtable", "mtr", "mtd", "mpadded", "mphantom", "menclose", "mstyle",
];
const ATTRIBUTES = [
  "href", "title", "src", "alt", "class", "start", "align", "rel",
  "display", "encoding", "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace",
  "accent", "accentunder", "columnalign", "rowspacing", "columnspacing", "width", "height",
  "depth", "minsize", "maxsize", "movablelimits", "linethickness", "scriptlevel", "displaystyle",
  "notation", "symmetric", "largeop",
];
const PURIFY = {
  ALLOWED_TAGS: [...HTML_TAGS, ...MATH_TAGS],
  ALLOWED_ATTR: ATTRIBUTES,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

function isLocalPath(url) {
  return url.startsWith("/") && !url.startsWith("//") && !url.includes("\\");
}

export function imageAllowed(src) {
  const url = String(src || "").trim();
  return SAFE_DATA_IMAGE.test(url) || isLocalPath(url);
}

DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  const value = String(data.attrValue || "").trim().toLowerCase();
  if (node.nodeName === "IMG" && data.attrName === "src" && !imageAllowed(data.attrValue)) data.keepAttr = false;
  if (node.nodeName === "A" && data.attrName === "href" && value.startsWith("data:")) data.keepAttr = false;
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A") node.setAttribute("rel", LINK_REL);
});

// --- markdown-it ----------------------------------------------------------------------------

const md = new MarkdownIt("commonmark", { html: false, linkify: false, typographer: false });
md.enable(["table", "strikethrough"]);
const escapeHtml = md.utils.escapeHtml;

function codeBlock(code, lang) {
  let body = null;
  if (lang && lang.length <= MAX_LANG_CHARS && code.length <= MAX_HIGHLIGHT_CHARS && hljs.getLanguage(lang)) {
    try {
      body = hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
    } catch {
      body = null;
    }
  }
  const label = escapeHtml(lang || "text");
  const cls = lang ? `hljs language-${escapeHtml(lang)}` : "hljs";
  return `<div class="code-block"><div class="code-head"><span class="code-lang">${label}</span></div><pre><code class="${cls}">${body ?? escapeHtml(code)}</code></pre></div>\n`;
}

md.renderer.rules.fence = (tokens, idx) => {
  const token = tokens[idx];
  const info = token.info ? md.utils.unescapeAll(token.info).trim() : "";
  return codeBlock(token.content, info.split(/\s+/)[0] || "");
};
md.renderer.rules.code_block = (tokens, idx) => codeBlock(tokens[idx].content, "");

md.renderer.rules.image = (tokens, idx, options, env, self) => {
  const token = tokens[idx];
  const src = token.attrGet("src") || "";
  const alt = self.renderInlineAsText(token.children || [], options, env);
  if (imageAllowed(src)) return `<img src="${escapeHtml(src)}" alt="${escapeHtml(alt)}">`;
  return `<span class="remote-image">[${escapeHtml(alt || "image")}: remote image not loaded]</span>`;
};

// --- math: $inline$ and $$display$$ ---------------------------------------------------------

function isSpace(code) {
  return code === 0x20 || code === 0x09 || code === 0x0a;
}

// Pandoc's rule, so prices ("$5 and $10") stay text: the opening $ is followed by a
// non-space, the closing $ follows a non-space and is not followed by a digit.
function mathInline(state, silent) {
  const src = state.src;
  const start = state.pos;
  if (src.charCodeAt(start) !== 0x24 || src.charCodeAt(start + 1) === 0x24) return false;
  if (start + 1 >= state.posMax || isSpace(src.charCodeAt(start + 1))) return false;
  let end = start + 1;
  for (;;) {
    end = src.indexOf("$", end);
    if (end === -1 || end >= state.posMax) return false;
    if (src.charCodeAt(end - 1) !== 0x5c) break;
    end += 1;
  }
  if (isSpace(src.charCodeAt(end - 1))) return false;
  const after = src.charCodeAt(end + 1);
  if (after >= 0x30 && after <= 0x39) return false;
  if (!silent) {
    const token = state.push("math_inline", "math", 0);
    token.content = src.slice(start + 1, end);
  }
  state.pos = end + 1;
  return true;
}

// A block from a line starting with $$ to a line ending with $$; like a code fence, an
// unclosed one runs to the end (so a streaming block never changes what came before it).
function mathBlock(state, startLine, endLine, silent) {
  let pos = state.bMarks[startLine] + state.tShift[startLine];
  let max = state.eMarks[startLine];
  if (state.sCount[startLine] - state.blkIndent >= 4) return false;
  if (state.src.slice(pos, pos + 2) !== "$$") return false;
  if (silent) return true;
  const first = state.src.slice(pos + 2, max);
  const lines = [];
  let line = startLine;
  let closed = false;
  if (first.trimEnd().endsWith("$$")) {
    lines.push(first.trimEnd().slice(0, -2));
    closed = true;
  } else {
    lines.push(first);
    for (line = startLine + 1; line < endLine; line += 1) {
      pos = state.bMarks[line] + state.tShift[line];
      max = state.eMarks[line];
      if (pos < max && state.sCount[line] < state.blkIndent) break;
      const text = state.src.slice(pos, max).trimEnd();
      if (text.endsWith("$$")) {
        lines.push(text.slice(0, -2));
        closed = true;
        break;
      }
      lines.push(text);
    }
  }
  state.line = closed ? line + 1 : line;
  const token = state.push("math_block", "math", 0);
  token.block = true;
  token.content = lines.join("\n");
  token.map = [startLine, state.line];
  return true;
}

function renderMath(content, displayMode) {
  try {
    return katex.renderToString(content, { ...KATEX_OPTIONS, displayMode });
  } catch {
    return `<code>${escapeHtml(content)}</code>`;
  }
}

md.inline.ruler.after("escape", "math_inline", mathInline);
md.block.ruler.before("fence", "math_block", mathBlock, { alt: ["paragraph", "reference", "blockquote", "list"] });
md.renderer.rules.math_inline = (tokens, idx) => renderMath(tokens[idx].content, false);
md.renderer.rules.math_block = (tokens, idx) => `<div class="math-block">${renderMath(tokens[idx].content, true)}</div>\n`;

// --- blocks -----------------------------------------------------------------------------------

// Top-level blocks of a token stream: [{tokens, line}] (line: where the block starts).
function topLevelBlocks(tokens) {
  const blocks = [];
  let current = null;
  let depth = 0;
  for (const token of tokens) {
    if (depth === 0) {
      current = { tokens: [], line: token.map ? token.map[0] : 0 };
      blocks.push(current);
    }
    current.tokens.push(token);
    depth += token.nesting;
  }
  return blocks;
}

function offsetOfLine(text, line) {
  let offset = 0;
  for (let n = 0; n < line; n += 1) {
    const next = text.indexOf("\n", offset);
    if (next === -1) return text.length;
    offset = next + 1;
  }
  return offset;
}

// Sanitised DOM for one block's tokens, with its copy buttons.
function blockFragment(tokens, env) {
  const fragment = DOMPurify.sanitize(md.renderer.render(tokens, md.options, env), PURIFY);
  for (const head of fragment.querySelectorAll(".code-head")) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.dataset.action = "copy-code";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy code");
    head.append(button);
  }
  return fragment;
}

function blockElement(tokens, env) {
  const div = document.createElement("div");
  div.className = "md-block";
  div.append(blockFragment(tokens, env));
  return div;
}

// Incremental rendering into `container`: append text as it streams, `finish()` at the end.
export class LiveMarkdown {
  constructor(container) {
    this.container = container;
    this.source = "";
    this.tailStart = 0; // offset in `source` where the open (last) block begins
    this.tail = null; // the open block's element
    this.container.replaceChildren();
  }

  append(text) {
    if (!text) return;
    this.source += text;
    this.update(false);
  }

  // `complete`: no more text will come, so the last line is a whole line.
  update(complete) {
    const tailText = this.source.slice(this.tailStart);
    const env = {};
    const blocks = topLevelBlocks(md.parse(tailText, env));
    let last = blocks.length ? blocks[blocks.length - 1] : null;
    if (blocks.length > 1) {
      const lastStart = offsetOfLine(tailText, last.line);
      // A block is finished once a later block has begun on a complete line (a partial
      // line such as "2" may yet become "2. item" and continue the list above it).
      if (complete || tailText.indexOf("\n", lastStart) !== -1) {
        const finished = blocks.slice(0, -1).map((block) => blockElement(block.tokens, env));
        if (this.tail) this.tail.replaceWith(...finished);
        else this.container.append(...finished);
        this.tail = null;
        this.tailStart += lastStart;
      } else {
        // Keep every block as the open tail until the new line is complete.
        last = { tokens: blocks.flatMap((block) => block.tokens) };
      }
    }
    const element = last ? blockElement(last.tokens, env) : null;
    if (this.tail && element) this.tail.replaceWith(element);
    else if (this.tail) this.tail.remove();
    else if (element) this.container.append(element);
    this.tail = element;
  }

  // The whole text is here: link reference definitions apply to the entire text, so a
  // reply that uses them is rendered once more as a whole (rare; equal to a reload).
  finish() {
    this.update(true);
    const env = {};
    md.parse(this.source, env);
    if (env.references && Object.keys(env.references).length) {
      const all = this.source;
      this.container.replaceChildren();
      this.source = "";
      this.tailStart = 0;
      this.tail = null;
      renderWhole(this.container, all);
    }
    this.tail = null;
  }
}

// Stored text: parsed once; each top-level block becomes a block element, as in streaming.
function renderWhole(container, text) {
  const env = {};
  const blocks = topLevelBlocks(md.parse(text, env));
  container.replaceChildren(...blocks.map((block) => blockElement(block.tokens, env)));
}

export function renderMarkdown(container, text) {
  const env = {};
  md.parse(text, env);
  if (env.references && Object.keys(env.references).length) {
    renderWhole(container, text);
    return;
  }
  const live = new LiveMarkdown(container);
  live.source = text || "";
  live.finish();
}

// Replace each server-rendered `[data-markdown]` element's content by this renderer's
// (the server's HTML is the fallback for a page without scripts).
export function hydrate(root) {
  for (const node of root.querySelectorAll("[data-markdown]:not([data-rendered])")) {
    renderMarkdown(node, node.dataset.markdown);
    node.dataset.rendered = "1";
  }
}
