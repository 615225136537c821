"""What a stored message's content says as text: the pieces every reader of a transcript
(the page, search snippets) agrees on."""

from __future__ import annotations

from typing import Any


def text_parts(content: Any) -> str:
    """The text parts of a message's content (a string, or a list of parts), joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""
