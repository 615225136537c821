"""The page's Markdown renderer (static/js/renderer.js) in Chromium, under the app's CSP:
streamed text rendered incrementally ends exactly as the same text rendered whole (what a
reload shows), whatever the chunking; it formats while streaming; and the XSS corpus,
streamed in small chunks, runs nothing and leaves no hostile markup.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import browser  # noqa: F401 - fixture
from tests.e2e.render_harness import HarnessServer, open_harness
from tests.security.test_xss import DOM_AUDIT, TRAP
from tests.security.xss_corpus import payloads

pytestmark = [pytest.mark.distributed]

RICH = """# Plan

Some **bold**, *italic*, `code`, ~~gone~~ and a [link](https://example.com/a?b=1).

1. first
2. second

3. third after a blank line (one loose list)

- a
  - nested
- b

> quoted
> text

| name | value |
| ---- | ----: |
| a    |     1 |
| b    |     2 |

```python
def hello(name: str) -> str:
    return f"hi {name}"
```

Inline math $e^{i\\pi} + 1 = 0$ and prices like $5 and $10 stay text.

$$
\\int_0^1 x^2\\,dx = \\frac{1}{3}
$$

    indented code

![remote](https://example.com/x.png) and ![local](/static/favicon.ico)

Setext heading
--------------

---

Last paragraph with a reference [ref].

[ref]: https://example.com/ref
"""

DOCS = {
    "rich": RICH,
    "no trailing newline": "para one\n\n## two\n\n- x\n- y",
    "unclosed fence": "text\n\n```js\nlet a = 1;\n",
    "list interrupted late": "1. a\n\n2. b\n\n20. c\n\nend",
    "nested quote list": "> - a\n>\n> - b\n\nafter\n",
}
CHUNKINGS = (1, 2, 5, 17, 64)


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.fixture(scope="module")
def harness(browser: object) -> Iterator[object]:  # noqa: F811
    server = HarnessServer()
    page = open_harness(browser, server)
    yield page
    page.close()  # type: ignore[attr-defined]
    server.close()


@pytest.mark.parametrize("name", sorted(DOCS))
def test_streamed_markdown_ends_equal_to_the_whole_render(harness: object, name: str) -> None:
    text = DOCS[name]
    whole = harness.evaluate("(t) => window.harness.whole(t)", text)  # type: ignore[attr-defined]
    for size in CHUNKINGS:
        live = harness.evaluate("(c) => window.harness.live(c)", chunks(text, size))  # type: ignore[attr-defined]
        assert live == whole, f"chunks of {size}"


def test_the_rich_document_renders_every_kind_of_block(harness: object) -> None:
    harness.evaluate("(t) => window.harness.whole(t)", RICH)  # type: ignore[attr-defined]
    found = harness.evaluate(  # type: ignore[attr-defined]
        """() => {
          const out = document.getElementById("out");
          const q = (s) => out.querySelectorAll(s).length;
          return {
            h1: q("h1"), h2: q("h2"), table: q("table"), quote: q("blockquote"),
            ol: q("ol"), olItems: q("ol > li"), nested: q("ul ul"), strong: q("strong"),
            del: q("s, del"), code: q("pre code.hljs.language-python .hljs-keyword"),
            lang: out.querySelector(".code-lang")?.textContent, copy: q(".code-head button.copy"),
            math: q("math"), display: q(".math-block math[display=block]"),
            remote: out.querySelector(".remote-image")?.textContent,
            localImg: q("img[src='/static/favicon.ico']"),
            rel: out.querySelector("a[href^='https://example.com/a']")?.rel,
            ref: q("a[href='https://example.com/ref']"),
            text: out.textContent,
          };
        }"""
    )
    assert found["h1"] == 1 and found["h2"] == 1 and found["table"] == 1 and found["quote"] == 1
    assert found["ol"] == 1 and found["olItems"] == 3, "a loose ordered list stays one list"
    assert found["nested"] == 1 and found["strong"] >= 1 and found["del"] == 1
    assert found["code"] >= 1 and found["lang"] == "python" and found["copy"] == 2
    assert found["math"] == 2 and found["display"] == 1
    assert "$5 and $10" in found["text"]
    assert found["remote"] == "[remote: remote image not loaded]" and found["localImg"] == 1
    assert found["rel"] == "noopener noreferrer nofollow"
    assert found["ref"] == 1


def test_formatting_appears_while_the_text_streams(harness: object) -> None:
    partial = RICH[: RICH.index("```python") + 30]  # inside the open code fence
    state = harness.evaluate(  # type: ignore[attr-defined]
        """async (c) => {
          const { LiveMarkdown } = await import("/static/js/renderer.js");
          const out = document.getElementById("out");
          const live = new LiveMarkdown(out);
          for (const chunk of c) live.append(chunk);
          return { h1: out.querySelectorAll("h1").length,
                   table: out.querySelectorAll("table").length,
                   code: out.querySelectorAll("pre code.language-python").length,
                   blocks: out.querySelectorAll(".md-block").length };
        }""",
        chunks(partial, 3),
    )
    assert state["h1"] == 1 and state["table"] == 1 and state["code"] == 1
    assert state["blocks"] >= 7  # finished blocks, and the open fence


def test_the_xss_corpus_streamed_in_chunks_runs_nothing(browser: object) -> None:  # noqa: F811
    server = HarnessServer()
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        page.add_init_script(TRAP)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(server.url)
        page.wait_for_function("window.harnessReady === true")
        corpus = "\n\n".join(p for _n, p in payloads())
        for size in (3, 40):
            page.evaluate("(c) => window.harness.live(c)", chunks(corpus, size))
            page.evaluate("document.querySelectorAll('details').forEach((d) => { d.open = true; })")
            page.wait_for_timeout(500)
            assert page.evaluate("window.__xssHits") == []
            assert page.evaluate(DOM_AUDIT) == []
            assert "xss(" in page.inner_text("#out"), "the payloads were rendered as text"
        assert dialogs == []
        assert page.evaluate("window.__cspViolations") == []
    finally:
        page.close()
        server.close()
