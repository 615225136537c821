"""Server-side rendering of model and user text: Markdown → sanitised HTML.

One renderer for stored and live messages (the page fetches live messages' HTML from the
server once they are committed), so what a user sees never depends on which path drew it.

- markdown-it-py (CommonMark, plus tables and strikethrough) parses; raw HTML in the
  source is escaped, never passed through: model output is data.
- Pygments highlights fenced code with CSS classes only (`static/css/pygments.css`): the
  Content-Security-Policy forbids inline styles.
- nh3 (ammonia) sanitises the result against an allow-list, as a second wall behind the
  parser: even a parser bug cannot produce script, event handlers or styles.
- Remote images are never loaded (a beacon would leak that the transcript was opened):
  only `data:image/...` and same-origin paths keep an <img>; anything else becomes its
  alt text with a note.
"""

from __future__ import annotations

import html
from typing import Any

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Highlighting is linear but slow-ish per character; a pasted log of megabytes is shown
# plain rather than holding a page load for seconds.
MAX_HIGHLIGHT_CHARS = 100_000
# A language tag is a short word ("python", "c++"); longer info strings are not a lexer.
MAX_LANG_CHARS = 40
# Images: inline data only for raster types a browser renders without running anything.
SAFE_DATA_IMAGE_PREFIXES = (
    "data:image/png;",
    "data:image/jpeg;",
    "data:image/gif;",
    "data:image/webp;",
)

ALLOWED_TAGS = {
    "a", "p", "br", "hr", "em", "strong", "del", "s", "code", "pre", "span", "div",
    "blockquote", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td", "img",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "pre": {"class"},
    "span": {"class"},
    "div": {"class"},
    "ol": {"start"},
    "th": {"align"},
    "td": {"align"},
}
# `data` is accepted by the scheme filter only so `_attribute_filter` can keep safe image
# data URLs; it drops every other data: URL (links included).
URL_SCHEMES = {"http", "https", "mailto", "data"}

_formatter = HtmlFormatter(nowrap=True, classprefix="")


def _is_local_path(url: str) -> bool:
    """A same-origin path (`/sessions/...`): not protocol-relative (`//host`), no scheme."""
    return url.startswith("/") and not url.startswith("//") and "\\" not in url


def image_src_allowed(src: str) -> bool:
    src = src.strip()
    return src.startswith(SAFE_DATA_IMAGE_PREFIXES) or _is_local_path(src)


def _attribute_filter(element: str, attribute: str, value: str) -> str | None:
    if element == "img" and attribute == "src":
        return value if image_src_allowed(value) else None
    if element == "a" and attribute == "href" and value.strip().lower().startswith("data:"):
        return None
    return value


def _highlight(code: str, lang: str, _attrs: Any) -> str:
    """Pygments HTML for a fenced block, or "" to let markdown-it escape it plainly."""
    lang = (lang or "").strip().split()[0] if lang and lang.strip() else ""
    if not lang or len(lang) > MAX_LANG_CHARS or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang)
    except ClassNotFound:
        return ""
    body = highlight(code, lexer, _formatter)
    safe_lang = html.escape(lang, quote=True)
    return f'<pre class="highlight"><code class="language-{safe_lang}">{body}</code></pre>\n'


def _render_image(self: Any, tokens: list, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = self.renderInlineAsText(token.children or [], options, env)
    if image_src_allowed(src):
        return f'<img src="{html.escape(src, quote=True)}" alt="{html.escape(alt, quote=True)}">'
    label = html.escape(alt or "image")
    return f'<span class="remote-image">[{label}: remote image not loaded]</span>'


def _parser() -> MarkdownIt:
    md = MarkdownIt(
        "commonmark",
        {"html": False, "linkify": False, "typographer": False, "highlight": _highlight},
    )
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    return md


_md = _parser()


def sanitize(markup: str) -> str:
    return nh3.clean(
        markup,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        attribute_filter=_attribute_filter,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def render_markdown(text: str) -> str:
    """Sanitised HTML for Markdown `text` (safe to mark safe in a template)."""
    if not text:
        return ""
    return sanitize(_md.render(text))


def pygments_css() -> str:
    """The stylesheet for the highlight classes (written to static/css/pygments.css)."""
    return HtmlFormatter(classprefix="").get_style_defs(".highlight")
