"""A fake Mistral chat completions API (`https://api.mistral.ai/v1`).

The OpenAI-compatible fake with Mistral's own rules and shapes:

- Requests are checked against the `mistralai` SDK's request TypedDict, unknown keys
  refused at every level, so `stream_options` (not in Mistral's schema) is a 422 with
  Mistral's `extra_forbidden` detail, as the real API answers.
- Tool-call ids must be exactly nine characters of [a-zA-Z0-9], on calls and results
  alike (the real API's 400 otherwise); the ids the fake makes up are of that shape.
- Reasoning streams as typed content chunks: `delta.content` is a list holding a
  `{"type": "thinking", "thinking": [{"type": "text", "text": ...}]}` chunk while the
  model thinks, then text as plain strings (or, with `text_chunks=True`, as
  `{"type": "text"}` chunks). A whole reply's `content` is the list of both.
- Tool calls come whole, one delta each (no argument fragments).
- Usage arrives in the last chunk, with the finish reason, without being asked for.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Any

from .openai_chat import ChatRenderer, OpenAIChatFake, usage_object
from .script import Reasoning, Step, Text, ToolCall
from .server import Event, Exchange, RecordedRequest, pieces, tool_arguments_text
from .validate import mistral_request_problem

TOOL_CALL_ID = re.compile(r"[a-zA-Z0-9]{9}")
_ALPHANUMERIC = string.ascii_letters + string.digits


def tool_call_id() -> str:
    """An id of the shape Mistral issues (and demands back)."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


def mistral_error(message: Any, type: str = "invalid_request_error") -> dict[str, Any]:
    return {"object": "error", "message": message, "type": type, "param": None, "code": None}


class MistralFake(OpenAIChatFake):
    """Fake Mistral server; `text_chunks` sends text as typed chunks, not strings."""

    provider = "mistral"

    def __init__(self, *, text_chunks: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.text_chunks = text_chunks

    def handle(self, exchange: Exchange) -> None:
        request = exchange.request
        if request.method == "POST" and isinstance(request.body, dict) and self.validate:
            problem = mistral_request_problem(request.body)
            if problem is not None:
                exchange.send_json(422, mistral_error({"detail": problem}))
                return
            problem = _tool_id_problem(request.body.get("messages") or [])
            if problem is not None:
                exchange.send_json(400, mistral_error(problem))
                return
        super().handle(exchange)

    def renderer(self, request: RecordedRequest, reply: Any) -> ChatRenderer:
        return MistralRenderer(self, request, reply)


def _tool_id_problem(messages: list[Any]) -> str | None:
    for message in messages:
        if not isinstance(message, dict):
            continue
        ids = [c.get("id") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if message.get("role") == "tool":
            ids.append(message.get("tool_call_id"))
        for call_id in ids:
            if not TOOL_CALL_ID.fullmatch(str(call_id or "")):
                return f"Tool call id was {call_id} but must be a-z, A-Z, 0-9, with a length of 9."
    return None


class MistralRenderer(ChatRenderer):
    def __init__(self, fake: MistralFake, request: RecordedRequest, reply: Any) -> None:
        super().__init__(fake, request, reply)
        self.fake: MistralFake = fake
        self.include_usage = False  # no `usage: null` on every chunk: only on the last

    def start_events(self) -> list[Event]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def step_events(self, step: Step) -> list[Event]:
        if isinstance(step, Reasoning):
            self.reasoning.append(step.text)
            return [self._chunk({"content": [_thinking(piece)]}) for piece in pieces(step.text)]
        if isinstance(step, Text) and self.fake.text_chunks:
            self.text.append(step.text)
            return [
                self._chunk({"content": [{"type": "text", "text": piece}]})
                for piece in pieces(step.text)
            ]
        if isinstance(step, ToolCall):
            # Mistral sends each call whole, in one delta (its SDK's delta type demands
            # the name on every tool call), not in argument fragments.
            call = {
                "id": step.id or tool_call_id(),
                "type": "function",
                "function": {"name": step.name, "arguments": tool_arguments_text(step)},
            }
            self.tool_calls.append(call)
            return [self._chunk({"tool_calls": [{**call, "index": len(self.tool_calls) - 1}]})]
        return super().step_events(step)

    def finish_events(self) -> list[Event]:
        name, last = self._chunk({"content": ""}, self.finish_reason)
        assert isinstance(last, dict)
        if self.fake.report_usage:
            last["usage"] = usage_object(self.usage)
        return [(name, last), (None, "[DONE]")]

    def message(self) -> dict[str, Any]:
        completion = super().message()
        message = completion["choices"][0]["message"]
        for key in ("refusal", "annotations", self.fake.reasoning_field):
            message.pop(key, None)
        if self.reasoning:
            content: list[dict[str, Any]] = [_thinking("".join(self.reasoning))]
            if self.text:
                content.append({"type": "text", "text": "".join(self.text)})
            message["content"] = content
        return completion


def _thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": [{"type": "text", "text": text}]}
