"""The fake provider servers, driven by the official SDKs over real HTTP.

The SDKs parsing our events into the objects they promise (and their pydantic types
accepting every raw event) is the proof that the fakes speak the real wire protocols;
the provider-client tests can then trust a fake as a stand-in for the API.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic.types import Message
from anthropic.types.shared import ErrorResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.fakes import (
    AnthropicMessagesFake,
    OpenAIChatFake,
    Reply,
    Script,
    context_too_long,
    drip,
    error_event,
    http_error,
    model_not_found,
    overloaded,
    pause,
    quota_exceeded,
    rate_limited,
    reasoning,
    redacted_thinking,
    reset,
    text,
    tool_call,
    truncate,
    usage,
)
from tests.fakes.anthropic_messages import sign_thinking
from tests.fakes.process import FakeProcess
from tests.fakes.script import Usage
from tests.fakes.validate import (
    RequestValidationError,
    validate_anthropic_event,
    validate_anthropic_request,
    validate_openai_chat_request,
    validate_openai_chunk,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key"
USER_HI = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
def oai() -> Iterator[OpenAIChatFake]:
    with OpenAIChatFake(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def ant() -> Iterator[AnthropicMessagesFake]:
    with AnthropicMessagesFake(api_key=KEY) as fake:
        yield fake


def openai_client(fake: OpenAIChatFake, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0, **options)


def anthropic_client(fake: AnthropicMessagesFake, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.base_url, api_key=KEY, max_retries=0, **options)


def raw_sse(url: str, body: dict[str, Any], headers: dict[str, str]) -> list[tuple[str, str]]:
    """(event, data) pairs exactly as the server framed them."""
    events: list[tuple[str, str]] = []
    name, data = "", []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
            elif line == "" and data:
                events.append((name, "\n".join(data)))
                name, data = "", []
    return events


def openai_raw(fake: OpenAIChatFake, body: dict[str, Any]) -> list[str]:
    url = fake.base_url + "/chat/completions"
    return [data for _, data in raw_sse(url, body, {"Authorization": f"Bearer {KEY}"})]


def anthropic_raw(fake: AnthropicMessagesFake, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    events = raw_sse(fake.base_url + "/v1/messages", body, headers)
    parsed = [json.loads(data) for _, data in events]
    assert [name for name, _ in events] == [event["type"] for event in parsed]
    return parsed


# -- OpenAI Chat Completions ----------------------------------------------------------


def test_openai_stream_accumulates_text_and_tool_call_in_the_sdk(oai: OpenAIChatFake) -> None:
    oai.push(
        Reply(
            text("Let me check the "),
            text("weather."),
            tool_call("get_weather", {"city": "Oslo"}, id="call_1"),
        )
    )
    client = openai_client(oai)
    with client.chat.completions.stream(
        model="gpt-fake", messages=USER_HI, tools=[WEATHER_TOOL]
    ) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.message.content == "Let me check the weather."
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id == "call_1"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_openai_tool_arguments_arrive_in_several_fragments(oai: OpenAIChatFake) -> None:
    oai.push(Reply(tool_call("get_weather", {"city": "Oslo", "unit": "celsius"})))
    chunks = [
        ChatCompletionChunk.model_validate_json(data)
        for data in openai_raw(oai, {"model": "m", "messages": USER_HI, "stream": True})[:-1]
    ]
    fragments = [
        call.function.arguments
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
        if call.function and call.function.arguments
    ]
    assert len(fragments) > 1
    assert json.loads("".join(fragments)) == {"city": "Oslo", "unit": "celsius"}


def test_openai_every_chunk_validates_and_stream_ends_with_done(oai: OpenAIChatFake) -> None:
    oai.push(Reply(reasoning("hmm "), text("Hi there"), tool_call("f", {"a": 1})))
    body = {
        "model": "gpt-fake",
        "messages": USER_HI,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    data = openai_raw(oai, body)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    for chunk in chunks:
        validate_openai_chunk(chunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] > 0
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


def test_openai_usage_chunk_only_when_include_usage_is_requested(oai: OpenAIChatFake) -> None:
    chunks = [
        json.loads(item)
        for item in openai_raw(oai, {"model": "m", "messages": USER_HI, "stream": True})[:-1]
    ]
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_openai_scripted_usage_counts_cached_tokens_inside_prompt_tokens(
    oai: OpenAIChatFake,
) -> None:
    oai.push(
        Reply(
            reasoning("think"), text("ok"), usage(input=100, output=20, cache_read=300, reasoning=7)
        )
    )
    chunks = list(
        openai_client(oai).chat.completions.create(
            model="gpt-fake",
            messages=USER_HI,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    final = chunks[-1].usage
    assert final is not None
    assert final.prompt_tokens == 400
    assert final.prompt_tokens_details and final.prompt_tokens_details.cached_tokens == 300
    assert final.completion_tokens == 20
    assert final.completion_tokens_details
    assert final.completion_tokens_details.reasoning_tokens == 7
    assert final.total_tokens == 420


def test_openai_default_usage_estimates_four_chars_per_token(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("x" * 40)))
    completion = openai_client(oai).chat.completions.create(model="gpt-fake", messages=USER_HI)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 10
    assert completion.usage.prompt_tokens == len(json.dumps([None, USER_HI, None])) // 4 + 1


def test_openai_usage_hook_replaces_the_estimate() -> None:
    def cached_usage(request: Any, output_text: str) -> Usage:
        return Usage(input=5, output=len(output_text), cache_read=50)

    with OpenAIChatFake(api_key=KEY, usage_for=cached_usage) as fake:
        fake.push(Reply(text("abc")))
        completion = openai_client(fake).chat.completions.create(model="m", messages=USER_HI)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 55
    assert completion.usage.prompt_tokens_details
    assert completion.usage.prompt_tokens_details.cached_tokens == 50
    assert completion.usage.completion_tokens == 3


def test_openai_without_usage_reporting_sends_no_usage() -> None:
    with OpenAIChatFake(api_key=None, report_usage=False) as fake:
        completion = openai_client(fake).chat.completions.create(model="m", messages=USER_HI)
        chunks = list(
            openai_client(fake).chat.completions.create(
                model="m", messages=USER_HI, stream=True, stream_options={"include_usage": True}
            )
        )
    assert completion.usage is None
    assert all(chunk.usage is None for chunk in chunks)


def test_openai_non_streaming_completion_has_the_real_shape(oai: OpenAIChatFake) -> None:
    oai.push(
        Reply(reasoning("because"), text("Sunny."), tool_call("get_weather", {"city": "Rome"}))
    )
    response = httpx.post(
        oai.base_url + "/chat/completions",
        json={"model": "gpt-fake", "messages": USER_HI},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    completion = ChatCompletion.model_validate(response.json())
    message = completion.choices[0].message
    assert completion.object == "chat.completion"
    assert message.content == "Sunny."
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    assert response.json()["choices"][0]["message"]["reasoning_content"] == "because"
    assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_openai_reasoning_is_streamed_in_the_configured_field(field: str) -> None:
    with OpenAIChatFake(api_key=KEY, reasoning_field=field) as fake:
        fake.push(Reply(reasoning("step one, step two"), text("done")))
        chunks = list(
            openai_client(fake).chat.completions.create(model="m", messages=USER_HI, stream=True)
        )
    thought = "".join(getattr(c.choices[0].delta, field, None) or "" for c in chunks if c.choices)
    assert thought == "step one, step two"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "done"


def test_openai_forced_stop_reason_maps_to_length(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("cut"), stop="max_tokens"))
    completion = openai_client(oai).chat.completions.create(model="m", messages=USER_HI)
    assert completion.choices[0].finish_reason == "length"


def test_unscripted_request_echoes_the_last_user_message(oai: OpenAIChatFake) -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "echo this"}]},
    ]
    completion = openai_client(oai).chat.completions.create(model="m", messages=messages)
    assert completion.choices[0].message.content == "echo this"


def test_default_reply_answers_every_unscripted_request() -> None:
    script = Script(default=Reply(text("steady")))
    with OpenAIChatFake(api_key=KEY, script=script) as fake:
        client = openai_client(fake)
        answers = {
            client.chat.completions.create(model="m", messages=USER_HI).choices[0].message.content
            for _ in range(3)
        }
    assert answers == {"steady"}


def test_openai_wrong_key_is_401_invalid_api_key(oai: OpenAIChatFake) -> None:
    client = openai.OpenAI(base_url=oai.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="m", messages=USER_HI)
    assert caught.value.code == "invalid_api_key"


def test_openai_without_expected_key_accepts_requests_without_auth() -> None:
    with OpenAIChatFake(api_key=None) as fake:
        response = httpx.post(
            fake.base_url + "/chat/completions", json={"model": "llama3.3", "messages": USER_HI}
        )
    assert response.status_code == 200


def test_openai_models_endpoint_lists_the_known_models() -> None:
    with OpenAIChatFake(api_key=KEY, models=["gpt-a", "gpt-b"]) as fake:
        client = openai_client(fake)
        listed = [model.id for model in client.models.list()]
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="gpt-z", messages=USER_HI)
    assert listed == ["gpt-a", "gpt-b"]
    assert caught.value.code == "model_not_found"


def test_openai_rate_limit_carries_retry_after(oai: OpenAIChatFake) -> None:
    oai.push(rate_limited(retry_after=7))
    with pytest.raises(openai.RateLimitError) as caught:
        openai_client(oai).chat.completions.create(model="m", messages=USER_HI)
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.code == "rate_limit_exceeded"


def test_openai_quota_is_429_insufficient_quota(oai: OpenAIChatFake) -> None:
    oai.push(quota_exceeded())
    with pytest.raises(openai.RateLimitError) as caught:
        openai_client(oai).chat.completions.create(model="m", messages=USER_HI, stream=True)
    assert caught.value.code == "insufficient_quota"


@pytest.mark.parametrize(
    ("step", "error", "status", "code"),
    [
        (overloaded(), openai.InternalServerError, 503, None),
        (context_too_long(), openai.BadRequestError, 400, "context_length_exceeded"),
        (model_not_found(), openai.NotFoundError, 404, "model_not_found"),
        (http_error(500), openai.InternalServerError, 500, None),
    ],
)
def test_openai_http_errors_use_the_api_error_shape(
    oai: OpenAIChatFake, step: Any, error: type[openai.APIStatusError], status: int, code: Any
) -> None:
    oai.push(step)
    with pytest.raises(error) as caught:
        openai_client(oai).chat.completions.create(model="gpt-x", messages=USER_HI, stream=True)
    body = caught.value.response.json()
    assert caught.value.status_code == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code


def test_openai_http_error_with_a_raw_body_is_sent_verbatim(oai: OpenAIChatFake) -> None:
    oai.push(http_error(502, "<html>Bad Gateway</html>"))
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client(oai).chat.completions.create(model="m", messages=USER_HI)
    assert caught.value.response.text == "<html>Bad Gateway</html>"


def test_openai_error_event_after_200_raises_in_the_sdk(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("partial answer"), error_event("server", "boom")))
    seen: list[str] = []
    with pytest.raises(openai.APIError, match="boom"):
        for chunk in openai_client(oai).chat.completions.create(
            model="m", messages=USER_HI, stream=True
        ):
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "partial answer"


def test_openai_reset_mid_stream_is_a_connection_error(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("one two three"), reset()))
    seen: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in openai_client(oai).chat.completions.create(
            model="m", messages=USER_HI, stream=True
        ):
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "one two three"
    assert oai.disconnects == []


def test_openai_reset_before_response_is_a_connection_error(oai: OpenAIChatFake) -> None:
    oai.push(reset())
    with pytest.raises(openai.APIConnectionError):
        openai_client(oai).chat.completions.create(model="m", messages=USER_HI)


def test_openai_truncated_stream_ends_without_finish_reason_or_done(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("half of it"), truncate()))
    data = openai_raw(oai, {"model": "m", "messages": USER_HI, "stream": True})
    assert "[DONE]" not in data
    assert all(json.loads(item)["choices"][0]["finish_reason"] is None for item in data)
    assert len(oai.requests) == 1


def test_openai_truncated_non_streaming_body_fails_to_read(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("whole answer"), truncate()))
    with pytest.raises(openai.APIConnectionError):
        openai_client(oai).chat.completions.create(model="m", messages=USER_HI)


def test_drip_spaces_events_out(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("a"), drip(0.1), text("b c d")))
    stamps = []
    started = time.monotonic()
    for _ in openai_client(oai).chat.completions.create(model="m", messages=USER_HI, stream=True):
        stamps.append(time.monotonic())
    # Each event after the first leaves the server at least 0.1 s after the one before,
    # so the n-th arrives no sooner than n * 0.1 s after the request: a bound a busy
    # client cannot break (reading late only delays a stamp), where the gaps between
    # stamps shrink when one event is read late and the next on time.
    assert len(stamps) >= 4
    for index, stamp in enumerate(stamps[1:]):
        assert stamp - started >= index * 0.1 - 0.005, (index, stamp - started)


def test_per_event_delay_sets_a_token_rate() -> None:
    with OpenAIChatFake(api_key=KEY, delay=0.05) as fake:
        fake.push(Reply(text("one two three four five")))
        started = time.monotonic()
        list(openai_client(fake).chat.completions.create(model="m", messages=USER_HI, stream=True))
        elapsed = time.monotonic() - started
    assert elapsed >= 0.05 * 6


def test_pause_mid_stream_trips_the_client_read_timeout(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("before"), pause(3), text("after")))
    client = openai_client(oai, timeout=openai.Timeout(5, read=0.3))
    with pytest.raises(openai.APITimeoutError):
        list(client.chat.completions.create(model="m", messages=USER_HI, stream=True))


def test_client_closing_mid_stream_is_recorded_as_a_disconnect(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("slow " * 50), delay=0.05))
    stream = openai_client(oai).chat.completions.create(model="m", messages=USER_HI, stream=True)
    next(iter(stream))
    stream.close()
    assert oai.wait_for_disconnect(timeout=3)
    [disconnect] = oai.disconnects
    assert disconnect.path == "/v1/chat/completions"
    assert disconnect.request_index == 0
    assert 0 < disconnect.events_sent < 50


def test_client_leaving_during_a_pause_is_seen_before_the_pause_ends(oai: OpenAIChatFake) -> None:
    oai.push(Reply(text("hello"), pause(30), text("late")))
    stream = openai_client(oai).chat.completions.create(model="m", messages=USER_HI, stream=True)
    next(iter(stream))
    started = time.monotonic()
    stream.close()
    assert oai.wait_for_disconnect(timeout=3)
    assert time.monotonic() - started < 3


def test_requests_are_recorded_with_headers_and_parsed_body(oai: OpenAIChatFake) -> None:
    openai_client(oai).chat.completions.create(model="gpt-fake", messages=USER_HI, temperature=0)
    request = oai.last_request
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {"model": "gpt-fake", "messages": USER_HI, "temperature": 0}


@pytest.mark.parametrize(
    ("messages", "extra", "fragment"),
    [
        ([*USER_HI, {"role": "tool", "tool_call_id": "call_x", "content": "42"}], {}, "preceeding"),
        (
            [
                *USER_HI,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "user", "content": "and?"},
            ],
            {},
            "did not have response messages: c1",
        ),
        (USER_HI, {"stream_options": {"include_usage": True}}, "only allowed when 'stream'"),
        ([], {}, "too short"),
    ],
)
def test_openai_fake_refuses_structurally_invalid_requests(
    oai: OpenAIChatFake, messages: list[Any], extra: dict[str, Any], fragment: str
) -> None:
    response = httpx.post(
        oai.base_url + "/chat/completions",
        json={"model": "m", "messages": messages, **extra},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_openai_fake_accepts_answered_tool_calls(oai: OpenAIChatFake) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        *USER_HI,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    completion = openai_client(oai).chat.completions.create(model="m", messages=messages)
    assert completion.choices[0].finish_reason == "stop"


def test_unknown_path_is_404_in_the_api_shape(oai: OpenAIChatFake) -> None:
    response = httpx.post(oai.root_url + "/v1/completions", json={})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_hundreds_of_concurrent_streams_all_complete() -> None:
    count = 200
    script = Script(default=Reply(text("tok " * 10), delay=0.01))
    with OpenAIChatFake(api_key=KEY, script=script) as fake:
        client = openai_client(fake, http_client=None)

        def one(_: int) -> str:
            chunks = client.chat.completions.create(model="m", messages=USER_HI, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        with ThreadPoolExecutor(max_workers=count) as pool:
            answers = list(pool.map(one, range(count)))
    assert answers == ["tok " * 10] * count
    assert len(fake.requests) == count


# -- Anthropic Messages ---------------------------------------------------------------


def test_anthropic_stream_builds_the_final_message_in_the_sdk(ant: AnthropicMessagesFake) -> None:
    ant.push(
        Reply(
            reasoning("The user wants weather. "),
            reasoning("Call the tool."),
            text("Checking."),
            tool_call("get_weather", {"city": "Oslo"}, id="toolu_1"),
            usage(input=12, output=34, cache_read=100, cache_write=50),
        )
    )
    with anthropic_client(ant).messages.stream(
        model="claude-fake", max_tokens=2048, messages=USER_HI
    ) as stream:
        message = stream.get_final_message()
    thinking, said, call = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "The user wants weather. Call the tool."
    assert thinking.signature == sign_thinking(thinking.thinking)
    assert said.type == "text" and said.text == "Checking."
    assert call.type == "tool_use"
    assert (call.id, call.name, call.input) == ("toolu_1", "get_weather", {"city": "Oslo"})
    assert message.stop_reason == "tool_use"
    usage_ = message.usage
    assert (usage_.input_tokens, usage_.output_tokens) == (12, 34)
    assert usage_.cache_read_input_tokens == 100
    assert usage_.cache_creation_input_tokens == 50


def test_anthropic_every_event_validates_in_the_real_order(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(reasoning("hmm"), text("Hi "), text("there"), tool_call("f", {"a": [1, 2]})))
    events = anthropic_raw(
        ant, {"model": "claude-fake", "max_tokens": 64, "messages": USER_HI, "stream": True}
    )
    for event in events:
        validate_anthropic_event(event)
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start"
    assert kinds[1:3] == ["content_block_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert "signature_delta" in deltas
    assert deltas.count("input_json_delta") > 2
    assert events[0]["message"]["stop_reason"] is None


def test_anthropic_text_blocks_merge_and_a_tool_call_starts_a_new_block(
    ant: AnthropicMessagesFake,
) -> None:
    ant.push(Reply(text("a "), text("b"), tool_call("f"), text("after")))
    events = anthropic_raw(
        ant, {"model": "m", "max_tokens": 64, "messages": USER_HI, "stream": True}
    )
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "text"]


def test_anthropic_non_streaming_message_validates(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(reasoning("why"), text("Because."), usage(input=3, output=4)))
    message = anthropic_client(ant).messages.create(
        model="claude-fake", max_tokens=2048, messages=USER_HI
    )
    assert isinstance(message, Message)
    thinking, said = message.content
    assert thinking.type == "thinking" and thinking.signature == sign_thinking("why")
    assert said.type == "text" and said.text == "Because."
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 4)


def test_anthropic_redacted_thinking_block_is_emitted(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(redacted_thinking("opaque=="), text("ok")))
    with anthropic_client(ant).messages.stream(
        model="m", max_tokens=2048, messages=USER_HI
    ) as stream:
        message = stream.get_final_message()
    redacted, said = message.content
    assert redacted.type == "redacted_thinking" and redacted.data == "opaque=="
    assert said.type == "text"


def test_anthropic_thinking_sent_back_with_its_signature_is_accepted(
    ant: AnthropicMessagesFake,
) -> None:
    ant.push(Reply(reasoning("plan"), tool_call("f", {}, id="toolu_9")))
    client = anthropic_client(ant)
    first = client.messages.create(model="m", max_tokens=2048, messages=USER_HI)
    history = [
        *USER_HI,
        first.to_param(),
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "42"}],
        },
    ]
    second = client.messages.create(model="m", max_tokens=2048, messages=history)
    assert second.content[0].type == "text"
    assert second.content[0].text == "42"


def test_anthropic_edited_thinking_is_refused(ant: AnthropicMessagesFake) -> None:
    tampered = {"type": "thinking", "thinking": "edited", "signature": sign_thinking("plan")}
    history = [
        *USER_HI,
        {"role": "assistant", "content": [tampered, {"type": "text", "text": "x"}]},
        {"role": "user", "content": "go on"},
    ]
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        anthropic_client(ant).messages.create(model="m", max_tokens=64, messages=history)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "m", "messages": USER_HI}, "max_tokens: Field required"),
        (
            {"model": "m", "max_tokens": 9, "messages": [{"role": "system", "content": "x"}]},
            "should be 'user' or 'assistant'",
        ),
        (
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}
                ],
            },
            "unexpected `tool_use_id`",
        ),
        (
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [
                    *USER_HI,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
                        ],
                    },
                    {"role": "user", "content": "what happened?"},
                ],
            },
            "without `tool_result` blocks immediately after: toolu_1",
        ),
        (
            {
                "model": "m",
                "max_tokens": 2000,
                "thinking": {"type": "enabled", "budget_tokens": 4000},
                "messages": USER_HI,
            },
            "must be greater than `thinking.budget_tokens`",
        ),
        (
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": ""}]},
            "non-empty content",
        ),
        (
            {"model": "m", "max_tokens": 9, "messages": USER_HI, "tools": [{"name": "f"}]},
            "input_schema: Field required",
        ),
    ],
)
def test_anthropic_fake_refuses_structurally_invalid_requests(
    ant: AnthropicMessagesFake, body: dict[str, Any], fragment: str
) -> None:
    response = httpx.post(
        ant.base_url + "/v1/messages",
        json=body,
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 400
    payload = response.json()
    ErrorResponse.model_validate(payload)
    assert payload["error"]["type"] == "invalid_request_error"
    assert fragment in payload["error"]["message"]


def test_anthropic_consecutive_user_turns_pass_unless_strict_roles() -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [*USER_HI, *USER_HI]}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with AnthropicMessagesFake(api_key=KEY) as lenient:
        assert httpx.post(lenient.base_url + "/v1/messages", json=body, headers=headers).is_success
    with AnthropicMessagesFake(api_key=KEY, strict_roles=True) as strict:
        response = httpx.post(strict.base_url + "/v1/messages", json=body, headers=headers)
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("headers", "status", "kind"),
    [
        ({"x-api-key": KEY}, 400, "invalid_request_error"),
        ({"anthropic-version": "2023-06-01"}, 401, "authentication_error"),
        ({"x-api-key": "nope", "anthropic-version": "2023-06-01"}, 401, "authentication_error"),
    ],
)
def test_anthropic_headers_are_checked(
    ant: AnthropicMessagesFake, headers: dict[str, str], status: int, kind: str
) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": USER_HI}
    response = httpx.post(ant.base_url + "/v1/messages", json=body, headers=headers)
    assert response.status_code == status
    assert response.json()["error"]["type"] == kind


def test_anthropic_x_api_key_header_is_accepted(ant: AnthropicMessagesFake) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": USER_HI}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    response = httpx.post(ant.base_url + "/v1/messages", json=body, headers=headers)
    Message.model_validate(response.json())


@pytest.mark.parametrize(
    ("step", "error", "status", "kind"),
    [
        (overloaded(), anthropic.OverloadedError, 529, "overloaded_error"),
        (rate_limited(retry_after=3), anthropic.RateLimitError, 429, "rate_limit_error"),
        (model_not_found(), anthropic.NotFoundError, 404, "not_found_error"),
        (context_too_long(), anthropic.BadRequestError, 400, "invalid_request_error"),
        (quota_exceeded(), anthropic.BadRequestError, 400, "invalid_request_error"),
    ],
)
def test_anthropic_http_errors_use_the_api_error_shape(
    ant: AnthropicMessagesFake,
    step: Any,
    error: type[anthropic.APIStatusError],
    status: int,
    kind: str,
) -> None:
    ant.push(step)
    with pytest.raises(error) as caught:
        anthropic_client(ant).messages.create(
            model="claude-x", max_tokens=9, messages=USER_HI, stream=True
        )
    body = caught.value.response.json()
    ErrorResponse.model_validate(body)
    assert caught.value.status_code == status
    assert body["error"]["type"] == kind
    assert caught.value.response.headers["request-id"] == body["request_id"]


def test_anthropic_model_not_found_names_the_model(ant: AnthropicMessagesFake) -> None:
    ant.push(model_not_found())
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic_client(ant).messages.create(model="claude-nope", max_tokens=9, messages=USER_HI)
    assert caught.value.response.json()["error"]["message"] == "model: claude-nope"


def test_anthropic_rate_limit_carries_retry_after(ant: AnthropicMessagesFake) -> None:
    ant.push(rate_limited(retry_after=3))
    with pytest.raises(anthropic.RateLimitError) as caught:
        anthropic_client(ant).messages.create(model="m", max_tokens=9, messages=USER_HI)
    assert caught.value.response.headers["retry-after"] == "3"


def test_anthropic_error_event_after_200_raises_in_the_sdk(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(text("partial"), error_event("overloaded")))
    events = anthropic_raw(
        ant, {"model": "m", "max_tokens": 9, "messages": USER_HI, "stream": True}
    )
    assert events[-1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    validate_anthropic_event(events[-1])
    ant.push(Reply(text("partial"), error_event("overloaded")))
    client = anthropic_client(ant)
    with (
        pytest.raises(anthropic.APIStatusError, match="overloaded_error"),
        client.messages.stream(model="m", max_tokens=9, messages=USER_HI) as stream,
    ):
        stream.get_final_message()


def test_anthropic_error_event_in_a_non_streaming_reply_becomes_the_http_error(
    ant: AnthropicMessagesFake,
) -> None:
    ant.push(Reply(text("x"), error_event("overloaded")))
    with pytest.raises(anthropic.OverloadedError):
        anthropic_client(ant).messages.create(model="m", max_tokens=9, messages=USER_HI)


def test_anthropic_reset_mid_stream_fails_the_sdk_stream(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(text("one two"), reset()))
    # The anthropic SDK lets its transport's error through mid-stream (no wrapping).
    client = anthropic_client(ant)
    with (
        pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)),
        client.messages.stream(model="m", max_tokens=9, messages=USER_HI) as stream,
    ):
        stream.get_final_message()


def test_anthropic_truncated_stream_has_no_message_stop(ant: AnthropicMessagesFake) -> None:
    ant.push(Reply(text("half"), truncate()))
    events = anthropic_raw(
        ant, {"model": "m", "max_tokens": 9, "messages": USER_HI, "stream": True}
    )
    kinds = [event["type"] for event in events]
    assert "message_stop" not in kinds and "message_delta" not in kinds
    ant.push(Reply(text("half"), truncate()))
    with anthropic_client(ant).messages.stream(model="m", max_tokens=9, messages=USER_HI) as s:
        message = s.get_final_message()
    assert message.stop_reason is None


def test_anthropic_default_reply_echoes_tool_results(ant: AnthropicMessagesFake) -> None:
    messages = [
        *USER_HI,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
        },
    ]
    message = anthropic_client(ant).messages.create(model="m", max_tokens=9, messages=messages)
    assert message.content[0].type == "text" and message.content[0].text == "sunny"


def test_anthropic_count_tokens_and_models(ant: AnthropicMessagesFake) -> None:
    client = anthropic_client(ant)
    counted = client.messages.count_tokens(model="claude-fake", messages=USER_HI)
    assert counted.input_tokens > 0
    assert [model.id for model in client.models.list()] == ["claude-fake"]


# -- script, validation helpers, subprocess mode ----------------------------------------


def test_reply_round_trips_through_json() -> None:
    reply = Reply(
        reasoning("r"),
        text("t"),
        tool_call("f", {"a": 1}, id="c"),
        usage(input=1, output=2, cache_read=3),
        drip(0.1),
        pause(0.2),
        error_event("rate_limit", "slow"),
        delay=0.01,
        stop="max_tokens",
    )
    assert Reply.from_json(json.loads(json.dumps(reply.to_json()))) == reply
    limited = Reply(rate_limited(2))
    assert Reply.from_json(json.loads(json.dumps(limited.to_json()))) == limited


def test_script_json_rejects_unknown_step_types() -> None:
    with pytest.raises(ValueError, match="unknown step type"):
        Script.from_json([{"steps": [{"type": "txt", "text": "x"}]}])


def test_http_error_must_be_the_first_step() -> None:
    with pytest.raises(ValueError, match="first step"):
        Reply(text("x"), http_error(500))


def test_validate_openai_request_accepts_a_real_body() -> None:
    validate_openai_chat_request(
        {
            "model": "gpt-fake",
            "messages": [
                {"role": "system", "content": "be brief"},
                *USER_HI,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            "tools": [WEATHER_TOOL],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "contents": "hi"}]},
        {"model": "m", "messages": USER_HI, "max_token": 5},
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
                    ],
                }
            ],
        },
        {
            "model": "m",
            "messages": USER_HI,
            "tools": [{"type": "function", "function": {"nam": "f"}}],
        },
    ],
)
def test_validate_openai_request_catches_wrong_names_and_types(body: dict[str, Any]) -> None:
    with pytest.raises(RequestValidationError):
        validate_openai_chat_request(body)


def test_validate_openai_request_allows_named_vendor_extensions() -> None:
    body = {"model": "m", "messages": USER_HI, "thinking": {"type": "enabled"}}
    with pytest.raises(RequestValidationError):
        validate_openai_chat_request(body)
    validate_openai_chat_request(body, extra_fields=["thinking"])


def test_validate_anthropic_request_accepts_a_real_body() -> None:
    validate_anthropic_request(
        {
            "model": "claude-fake",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                *USER_HI,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
                },
            ],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "stream": True,
        }
    )


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": USER_HI},
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "txt", "text": "x"}]}],
        },
        {
            "model": "m",
            "max_tokens": 5,
            "messages": USER_HI,
            "tools": [{"name": "f", "parameters": {}}],
        },
        {"model": "m", "max_tokens": "many", "messages": USER_HI},
    ],
)
def test_validate_anthropic_request_catches_wrong_names_and_types(body: dict[str, Any]) -> None:
    with pytest.raises(RequestValidationError):
        validate_anthropic_request(body)


def test_standalone_process_prints_base_url_and_serves_the_script(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"steps": [{"type": "text", "text": "from file"}]}]))
    command = [sys.executable, "-m", "tests.fakes", "--provider", "openai", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--script", str(script)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
        answer = client.chat.completions.create(model="m", messages=USER_HI)
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert answer.choices[0].message.content == "from file"
    assert process.returncode == 0


def test_fake_process_is_scripted_and_inspected_across_processes() -> None:
    with FakeProcess("anthropic", script=[Reply(text("scripted"))]) as fake:
        client = anthropic.Anthropic(base_url=fake.base_url, api_key=KEY, max_retries=0)
        first = client.messages.create(model="claude-fake", max_tokens=9, messages=USER_HI)
        fake.push(Reply(text("pushed later")))
        second = client.messages.create(model="claude-fake", max_tokens=9, messages=USER_HI)
        recorded = fake.requests()
        fake.clear()
        cleared = fake.requests()
    assert [first.content[0].text, second.content[0].text] == ["scripted", "pushed later"]  # type: ignore[union-attr]
    assert [r["body"]["messages"] for r in recorded] == [USER_HI, USER_HI]
    assert recorded[0]["headers"]["anthropic-version"]
    assert cleared == []


def test_stop_returns_promptly_with_a_stream_paused_mid_flight() -> None:
    fake = OpenAIChatFake(api_key=KEY).start()
    fake.push(Reply(text("x"), pause(60)))
    done = threading.Event()

    def consume() -> None:
        with contextlib.suppress(openai.APIError):
            client = openai_client(fake)
            list(client.chat.completions.create(model="m", messages=USER_HI, stream=True))
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert fake.wait_for_requests(1)
    time.sleep(0.1)
    started = time.monotonic()
    fake.stop()
    assert time.monotonic() - started < 3
    assert done.wait(5)
