"""Prompt caching as it lands on each wire, its byte-stability, the metering and the cost.

The caching fakes (`simulate_cache=True`) meter prefixes the way the vendors do, so these
tests see the effect of the breakpoints end to end through our router and transport.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from openworker.runtime.agent.compaction import CompactionState, apply_to_outbound
from providers.cache_spec import get_cache_spec
from providers.capabilities import Prices
from providers.context import build_context
from providers.outbound import OutboundPolicy
from providers.registry import get_descriptor
from providers.router import ProviderRouter
from providers.transport import encode_body
from providers.types import TokenUsage
from providers.usage import usage_from_anthropic, usage_from_openai
from providers.wire import anthropic_messages, openai_completions
from tests.fakes.anthropic_messages import AnthropicMessagesFake, count_cache_marks
from tests.fakes.openai_chat import OpenAIChatFake, cached_tokens
from tests.fakes.validate import validate_anthropic_request, validate_openai_chat_request

KEY = "test-key"
MARK = {"type": "ephemeral"}
# A system prompt well above the 1024-token cacheable minimum (chars/4 in the fakes).
SYSTEM = "You are a careful coworker. " * 200
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "search",
        "description": "Search the workspace.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
]


def anthropic_router(fake_server: AnthropicMessagesFake) -> ProviderRouter:
    secrets = {"provider:anthropic": {"api_key": KEY, "base_url": fake_server.base_url}}
    return ProviderRouter(secrets, outbound=OutboundPolicy(allow_loopback=True))


def completions_client(name, profile, secrets, *, transport, capabilities):
    """Chat Completions for any provider: `openai` itself speaks Responses by default, but
    its declaration (prompt_cache_key) holds on Completions too, and this fake speaks it."""
    return openai_completions.OpenAICompletionsClient(
        get_descriptor(name),
        api_key=profile.get("api_key"),
        base_url=profile.get("base_url"),
        transport=transport,
        capabilities=capabilities,
    )


def openai_router(fake_server: OpenAIChatFake, name: str = "openai") -> ProviderRouter:
    secrets = {f"provider:{name}": {"api_key": KEY, "base_url": fake_server.base_url}}
    return ProviderRouter(
        secrets,
        outbound=OutboundPolicy(allow_loopback=True),
        client_factory=completions_client,
    )


@pytest.fixture
def caching_anthropic() -> Iterator[AnthropicMessagesFake]:
    with AnthropicMessagesFake(api_key=KEY, simulate_cache=True) as server:
        yield server


@pytest.fixture
def caching_openai() -> Iterator[OpenAIChatFake]:
    with OpenAIChatFake(api_key=KEY, simulate_cache=True) as server:
        yield server


def call(router: ProviderRouter, model: str, messages, *, stream: bool, **settings: Any):
    if stream:
        return list(router.stream(model=model, messages=messages, tools=TOOLS, **settings))[-1].turn
    return router.complete(model=model, messages=messages, tools=TOOLS, **settings)


def history(turns: int) -> list[dict[str, Any]]:
    """A system prompt, then `turns` user asks each answered through one tool call."""
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for n in range(turns):
        out.append({"role": "user", "content": f"Question {n}: what is in file {n}?"})
        call_id = f"toolu_{n}"
        out.append(
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [{"id": call_id, "name": "read_file", "arguments": {"path": f"{n}"}}],
            }
        )
        out.append({"role": "tool", "tool_call_id": call_id, "content": f"contents {n} " * 40})
        out.append({"role": "assistant", "content": f"File {n} holds contents {n}."})
    return out


# --- Anthropic: cache_control landing -----------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_request_carries_the_system_tool_and_last_block_breakpoints(
    caching_anthropic, stream
):
    router = anthropic_router(caching_anthropic)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]

    call(router, "anthropic:claude-fake", messages, stream=stream)
    router.close()

    body = caching_anthropic.last_request.body
    validate_anthropic_request(body)
    assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": MARK}]
    assert [t.get("cache_control") for t in body["tools"]] == [None, MARK]
    assert body["messages"][-1]["content"][-1] == {
        "type": "text",
        "text": "Hi",
        "cache_control": MARK,
    }
    assert count_cache_marks(body) == 3
    assert messages[-1] == {"role": "user", "content": "Hi"}  # canonical copy untouched


def test_anthropic_tool_result_carries_the_breakpoint_in_a_tool_loop(caching_anthropic):
    router = anthropic_router(caching_anthropic)
    messages = history(1)[:-1]  # ends on the tool result

    call(router, "anthropic:claude-fake", messages, stream=True)
    router.close()

    body = caching_anthropic.last_request.body
    validate_anthropic_request(body)
    last_block = body["messages"][-1]["content"][-1]
    assert last_block["type"] == "tool_result"
    assert last_block["cache_control"] == MARK


def test_anthropic_long_retention_is_not_asked_of_a_non_anthropic_endpoint(caching_anthropic):
    router = anthropic_router(caching_anthropic)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]

    call(router, "anthropic:claude-fake", messages, stream=True, cache_retention="long")
    router.close()

    assert caching_anthropic.last_request.body["system"][0]["cache_control"] == MARK


def test_anthropic_long_retention_sends_the_one_hour_ttl_to_anthropic():
    body = anthropic_messages.build_request(
        build_context([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}], []),
        model="claude-sonnet-4-5",
        descriptor=get_descriptor("anthropic"),
        stream=True,
        settings={"cache_retention": "long"},
        cache_spec=get_cache_spec("anthropic"),
        base_url="https://api.anthropic.com",
    )

    validate_anthropic_request(body)
    long_mark = {"type": "ephemeral", "ttl": "1h"}
    assert body["system"][0]["cache_control"] == long_mark
    assert body["messages"][-1]["content"][-1]["cache_control"] == long_mark


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_second_turn_reads_what_the_first_wrote(caching_anthropic, stream):
    router = anthropic_router(caching_anthropic)
    first_history = history(1)[:2]
    first = call(router, "anthropic:claude-fake", first_history, stream=stream)
    second_history = [
        *history(1),
        {"role": "user", "content": "And the next one?"},
    ]
    second = call(router, "anthropic:claude-fake", second_history, stream=stream)
    router.close()

    assert first.usage.cache_read == 0
    assert first.usage.cache_write > 1024
    assert second.usage.cache_read == first.usage.cache_write
    assert second.usage.cache_write > 0
    # Buckets never overlap: context = fresh + read + write, each counted once.
    assert second.usage.context_tokens == (
        second.usage.input + second.usage.cache_read + second.usage.cache_write
    )
    assert second.usage.input < 50


# --- byte stability -----------------------------------------------------------------------


def anthropic_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return anthropic_messages.build_request(
        build_context(messages, TOOLS),
        model="claude-sonnet-4-5",
        descriptor=get_descriptor("anthropic"),
        stream=True,
        settings={"max_tokens": 1024},
        cache_spec=get_cache_spec("anthropic"),
    )


def prefix_to_last_mark(body: dict[str, Any]) -> bytes:
    """The encoded messages up to (not including) the last message breakpoint."""
    encoded = encode_body(body["messages"])
    marker = b',"cache_control":'
    cut = encoded.rfind(marker)
    assert cut > 0
    return encoded[:cut]


def assert_prefix_stable(earlier: dict[str, Any], later: dict[str, Any]) -> None:
    assert encode_body(earlier["system"]) == encode_body(later["system"])
    assert encode_body(earlier["tools"]) == encode_body(later["tools"])
    assert encode_body(later["messages"]).startswith(prefix_to_last_mark(earlier))

    # And the request as sent, up to that breakpoint: model, max_tokens, system, messages.
    # (Tools follow the messages in the JSON; the API renders them first, compared above.)
    def without_tools(body: dict[str, Any]) -> bytes:
        return encode_body({k: v for k, v in body.items() if k != "tools"})

    head = without_tools(earlier)
    assert without_tools(later).startswith(head[: head.rfind(b',"cache_control":')])


def test_consecutive_turns_keep_the_prefix_up_to_the_previous_breakpoint_byte_identical():
    h = history(2)
    h.append({"role": "user", "content": "Third question"})
    extended = [
        *h,
        {"role": "assistant", "content": "Third answer"},
        {"role": "user", "content": "Fourth question"},
    ]

    assert_prefix_stable(anthropic_body(h), anthropic_body(extended))


def test_tool_loop_steps_keep_the_prefix_byte_identical():
    h = history(2)[:-1]  # ends on a tool result
    extended = [
        *h,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "toolu_x", "name": "search", "arguments": {"q": "y"}}],
        },
        {"role": "tool", "tool_call_id": "toolu_x", "content": "found"},
    ]

    assert_prefix_stable(anthropic_body(h), anthropic_body(extended))


def test_after_a_compaction_block_and_tail_stay_byte_identical_between_turns():
    canonical = history(4)
    state = CompactionState(boundary_index=9, summary="Files 0 and 1 were read.")
    canonical.append({"role": "user", "content": "Next?"})
    first = anthropic_body(apply_to_outbound(canonical, state))
    canonical += [
        {"role": "assistant", "content": "Next answer"},
        {"role": "user", "content": "And then?"},
    ]
    second = anthropic_body(apply_to_outbound(canonical, state))

    assert first["messages"][0]["content"][0]["text"].startswith("[Summary")
    assert_prefix_stable(first, second)


def test_the_same_history_encodes_to_the_same_bytes_every_time():
    h = history(3)

    assert encode_body(anthropic_body(h)) == encode_body(anthropic_body(json.loads(json.dumps(h))))


# --- OpenAI family: prompt_cache_key ------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_openai_sends_the_session_id_as_prompt_cache_key(caching_openai, stream):
    router = openai_router(caching_openai)

    call(router, "openai:gpt-fake", history(1), stream=stream, cache_key="session-7")
    router.close()

    body = caching_openai.last_request.body
    validate_openai_chat_request(body)
    assert body["prompt_cache_key"] == "session-7"
    assert "cache_control" not in json.dumps(body)


def test_no_cache_key_setting_means_no_prompt_cache_key(caching_openai):
    router = openai_router(caching_openai)

    call(router, "openai:gpt-fake", history(1), stream=True)
    router.close()

    assert "prompt_cache_key" not in caching_openai.last_request.body


@pytest.mark.parametrize("name", ["deepseek", "ollama", "mistral", "groq"])
def test_compatible_vendors_without_a_key_field_get_none(name):
    body = openai_completions.build_request(
        build_context(history(1), TOOLS),
        model="m",
        descriptor=get_descriptor(name),
        stream=True,
        settings={"cache_key": "session-7"},
    )

    assert not {"prompt_cache_key", "prompt_cache_retention"} & set(body)


def test_xai_gets_the_session_id_as_its_routing_header(caching_openai):
    router = openai_router(caching_openai, name="xai")

    call(router, "xai:grok-fake", history(1), stream=True, cache_key="session-7")
    router.close()

    request = caching_openai.last_request
    assert request.headers["x-grok-conv-id"] == "session-7"
    assert "prompt_cache_key" not in request.body


@pytest.mark.parametrize("stream", [True, False])
def test_openai_cached_prompt_tokens_are_split_out_as_cache_read(caching_openai, stream):
    router = openai_router(caching_openai)
    first = call(router, "openai:gpt-fake", history(3), stream=stream, cache_key="s")
    longer = [*history(3), {"role": "user", "content": "One more?"}]
    second = call(router, "openai:gpt-fake", longer, stream=stream, cache_key="s")
    router.close()

    assert (first.usage.cache_read, first.usage.cache_write) == (0, 0)
    assert second.usage.cache_read >= 1024
    assert (second.usage.cache_read - 1024) % 128 == 0
    assert second.usage.input < 128 + 20
    assert second.usage.context_tokens > first.usage.context_tokens
    assert caching_openai.cache_keys == ["s", "s"]


def test_openai_fake_rounds_to_128_token_blocks_past_1024():
    assert [cached_tokens(n) for n in (0, 1023, 1024, 1151, 1152, 5000)] == [
        0,
        0,
        1024,
        1024,
        1152,
        4992,
    ]


# --- the Anthropic fake's cache simulation ------------------------------------------------


def test_without_breakpoints_nothing_is_cached():
    with AnthropicMessagesFake(api_key=KEY, simulate_cache=True) as server:
        body = {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "a"}]}
        first = server.cached_usage(body, "ok")
        second = server.cached_usage(body, "ok")

    assert (first.cache_read, first.cache_write) == (0, 0)
    assert (second.cache_read, second.cache_write) == (0, 0)


def test_prefixes_under_the_minimum_silently_do_not_cache():
    with AnthropicMessagesFake(api_key=KEY, simulate_cache=True) as server:
        body = {
            "model": "m",
            "system": [{"type": "text", "text": "short", "cache_control": MARK}],
            "messages": [{"role": "user", "content": "a"}],
        }
        server.cached_usage(body, "ok")
        again = server.cached_usage(body, "ok")

    assert (again.cache_read, again.cache_write) == (0, 0)


def test_a_changed_byte_before_the_breakpoint_misses():
    with AnthropicMessagesFake(api_key=KEY, simulate_cache=True) as server:

        def body(system: str) -> dict[str, Any]:
            return {
                "model": "m",
                "system": [{"type": "text", "text": system, "cache_control": MARK}],
                "messages": [{"role": "user", "content": "a"}],
            }

        written = server.cached_usage(body(SYSTEM), "ok")
        changed = server.cached_usage(body(SYSTEM + "."), "ok")

    assert written.cache_write > 1024
    assert changed.cache_read == 0
    assert changed.cache_write > 1024


def test_the_fake_refuses_more_than_four_breakpoints_like_the_api():
    with AnthropicMessagesFake(api_key=KEY) as server:
        tools = [
            {"name": f"t{i}", "input_schema": {"type": "object"}, "cache_control": MARK}
            for i in range(5)
        ]
        problem = server.check_request(
            {"model": "m", "max_tokens": 10, "messages": [], "tools": tools}
        )

    assert "maximum of 4 blocks with cache_control" in problem["error"]["message"]


# --- usage buckets and cost ---------------------------------------------------------------


def test_anthropic_usage_fields_map_to_buckets_one_to_one():
    usage = usage_from_anthropic(
        {
            "input_tokens": 50,
            "cache_creation_input_tokens": 248,
            "cache_read_input_tokens": 100_000,
            "output_tokens": 503,
        }
    )

    assert usage == TokenUsage(input=50, output=503, cache_read=100_000, cache_write=248)
    assert usage.context_tokens == 100_298


def test_openai_reasoning_tokens_are_counted_once_inside_output():
    usage = usage_from_openai(
        {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "prompt_tokens_details": {"cached_tokens": 1920},
            "completion_tokens_details": {"reasoning_tokens": 256},
        }
    )

    assert usage == TokenUsage(input=86, output=300, cache_read=1920, cache_write=0)


def test_cost_multiplies_per_million_prices_per_bucket():
    prices = Prices(input="3", output="15", cache_read="0.30", cache_write="3.75")
    usage = TokenUsage(input=1_000, output=2_000, cache_read=100_000, cache_write=10_000)

    cost = prices.cost(usage)

    expected = (
        Decimal("3") * 1_000
        + Decimal("15") * 2_000
        + Decimal("0.30") * 100_000
        + Decimal("3.75") * 10_000
    ) / 1_000_000
    assert cost == expected == Decimal("0.1005")


def test_cost_is_none_when_a_used_bucket_has_no_price():
    prices = Prices(input="3", output="15")

    assert prices.cost(TokenUsage(input=10, output=10, cache_read=5)) is None
    assert prices.cost(TokenUsage(input=10, output=10)) == Decimal("0.00018")
    assert prices.cost(None) is None
    assert Prices().cost(TokenUsage()) == Decimal(0)
