"""The server-side Markdown renderer: sanitised, highlighted, no remote images."""

from __future__ import annotations

from sessions.markdown import render_markdown


def test_raw_html_in_model_output_is_escaped():
    html = render_markdown("<script>alert(1)</script><img src=x onerror=alert(1)>")
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_javascript_and_data_links_are_dropped():
    html = render_markdown("[a](javascript:alert(1)) [b](data:text/html,hi) [c](https://ok.test)")
    assert 'href="javascript' not in html and 'href="data:' not in html
    assert 'href="https://ok.test"' in html and 'rel="noopener noreferrer nofollow"' in html


def test_remote_images_are_never_loaded():
    for src in ("https://tracker.test/p.png", "//tracker.test/p.png", "http://x/y.gif"):
        html = render_markdown(f"![pixel]({src})")
        assert "<img" not in html and "remote image not loaded" in html


def test_inline_and_same_origin_images_are_kept():
    html = render_markdown("![a](data:image/png;base64,AAAA) ![b](/sessions/1/attachments/2)")
    assert html.count("<img") == 2
    assert "<img" not in render_markdown("![s](data:image/svg+xml;base64,AAAA)")


def test_code_is_highlighted_with_classes_not_inline_styles():
    html = render_markdown("```python\ndef f():\n    return '<x>'\n```")
    assert '<pre class="highlight"><code class="language-python">' in html
    assert '<span class="k">def</span>' in html and "&lt;x&gt;" in html
    assert "style=" not in html


def test_tables_and_strikethrough_render_without_style_attributes():
    html = render_markdown("| a | b |\n|:-:|---|\n| 1 | ~~2~~ |")
    assert "<table>" in html and "<s>2</s>" in html and "style=" not in html


def test_unknown_languages_fall_back_to_escaped_plain_code():
    html = render_markdown("```no-such-lang\n<b>\n```")
    assert "&lt;b&gt;" in html and "<b>" not in html
