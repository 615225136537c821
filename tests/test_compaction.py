"""The compaction policy (openworker.runtime.agent.compaction): pure, no provider, no Django."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openworker.runtime.agent import compaction
from openworker.runtime.agent.compaction import (
    CONTINUATION_CONTRACT,
    SUMMARY_SYSTEM_PROMPT,
    CompactionState,
    apply_to_outbound,
    compact,
    compacted_block,
    estimate_tokens,
    keep_tokens,
    pick_boundary,
    render_span,
    should_compact,
    span_to_summarize,
    suffix_tokens,
    summarizer_messages,
    trigger_tokens,
)

# ----------------------------------------------------------------------------- builders

SYSTEM = {"role": "system", "content": "You are a coworker."}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str = "", *calls: tuple[str, str, dict]) -> dict:
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": i, "name": n, "arguments": a} for i, n, a in calls]
    return message


def tool(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def turn(n: int, *, steps: int = 1, result_chars: int = 50) -> list[dict]:
    """One user turn: the ask, `steps` tool round-trips, a final answer."""
    out = [user(f"request {n}")]
    for s in range(steps):
        call_id = f"c{n}_{s}"
        out.append(assistant("", (call_id, "read_file", {"path": f"/f{n}_{s}"})))
        out.append(tool(call_id, "x" * result_chars))
    out.append(assistant(f"answer {n}"))
    return out


def history(turns: int, **kw) -> list[dict]:
    out = [SYSTEM]
    for n in range(turns):
        out += turn(n, **kw)
    return out


def compact_json_tokens(messages: list[dict]) -> int:
    return len(json.dumps(messages, separators=(",", ":"))) // 4


# ----------------------------------------------------------------------------- constants


def test_constants_are_the_seeds():
    assert compaction.DEFAULT_THRESHOLD_PCT == 0.8
    assert compaction.DEFAULT_CAP_TOKENS == 250_000
    assert compaction.DEFAULT_CONTEXT_WINDOW == 128_000
    assert compaction.KEEP_RECENT_FRACTION == 0.25
    assert compaction.SUMMARY_MAX_TOKENS == 3_000
    assert compaction.SPAN_TOOL_RESULT_CLIP == 400
    assert compaction.SPAN_BUDGET_CHARS == 400_000
    assert compaction.USER_MESSAGE_CLIP == 600
    assert compaction.USER_MESSAGES_MAX == 40


# ----------------------------------------------------------------------------- trigger


def test_trigger_is_threshold_of_the_window():
    assert trigger_tokens(200_000) == 160_000


def test_unknown_window_falls_back_to_the_default():
    assert trigger_tokens(None) == trigger_tokens(0) == 102_400


def test_cap_makes_huge_windows_compact_early():
    assert trigger_tokens(1_000_000) == 250_000
    assert trigger_tokens(1_000_000, cap_tokens=300_000) == 300_000


def test_threshold_is_tunable():
    assert trigger_tokens(100_000, threshold_pct=0.5) == 50_000


def test_should_compact_fires_at_the_trigger_not_before():
    assert not should_compact(102_399, None)
    assert should_compact(102_400, None)


def test_disabled_compaction_never_fires():
    assert not should_compact(10**9, None, enabled=False)


def test_missing_signal_never_fires():
    assert not should_compact(None, 1_000)
    assert not should_compact(0, 1_000, threshold_pct=0.0)


def test_keep_budget_is_a_fraction_of_the_trigger():
    assert keep_tokens(None) == 25_600
    assert keep_tokens(200_000, keep_fraction=0.5) == 80_000


def test_keep_budget_of_a_capped_model_stays_well_under_its_trigger():
    window = 1_000_000
    assert keep_tokens(window) == 62_500
    assert keep_tokens(window) < trigger_tokens(window) // 2


# ----------------------------------------------------------------------------- estimate


def test_estimate_is_chars_over_four_of_compact_json():
    messages = history(3)
    assert estimate_tokens(messages) == compact_json_tokens(messages)


def test_estimate_of_nothing_is_zero():
    assert estimate_tokens([]) == 0


def test_estimate_ignores_what_never_reaches_a_provider():
    plain = assistant("done")
    annotated = {**plain, "reasoning": "r" * 4_000, "usage": {"input": 5, "output": 7}}
    assert estimate_tokens([annotated]) == estimate_tokens([plain])


def test_estimate_counts_provider_sidecars():
    plain = assistant("done")
    with_extras = {**plain, "extras": {"_openai": {"encrypted": "e" * 4_000}}}
    assert estimate_tokens([with_extras]) >= estimate_tokens([plain]) + 1_000


def test_image_counts_a_fixed_estimate_not_its_base64_length():
    def with_image(payload_chars: int) -> dict:
        url = "data:image/png;base64," + "A" * payload_chars
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }

    small, large = estimate_tokens([with_image(10)]), estimate_tokens([with_image(2_000_000)])
    assert small == large
    text_only = estimate_tokens([user("what is this?")])
    assert (
        compaction.IMAGE_TOKENS_ESTIMATE
        <= small - text_only
        < 1.1 * (compaction.IMAGE_TOKENS_ESTIMATE + 50)
    )


def test_pdf_counts_a_fixed_estimate_not_its_base64_length():
    def with_pdf(payload_chars: int) -> dict:
        data = "data:application/pdf;base64," + "J" * payload_chars
        part = {"type": "file", "file": {"filename": "a.pdf", "file_data": data}}
        return {"role": "user", "content": [part]}

    small, large = estimate_tokens([with_pdf(10)]), estimate_tokens([with_pdf(3_000_000)])
    assert small == large
    assert small >= compaction.FILE_TOKENS_ESTIMATE


def test_image_by_url_still_costs_image_tokens():
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert estimate_tokens([{"role": "user", "content": [part]}]) >= (
        compaction.IMAGE_TOKENS_ESTIMATE
    )


def test_cjk_text_counts_more_per_character_than_ascii():
    assert estimate_tokens([user("中" * 400)]) >= 590  # ~1.5 tokens per character
    assert estimate_tokens([user("a" * 400)]) < 120


def test_estimate_does_not_mutate_messages():
    url = "data:image/png;base64," + "A" * 100
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    before = copy.deepcopy(messages)
    estimate_tokens(messages)
    suffix_tokens(messages)
    assert messages == before


_texts = st.text(max_size=60)
_message = st.one_of(
    st.builds(user, _texts),
    st.builds(lambda t: {**assistant(t), "reasoning": t}, _texts),
    st.builds(lambda i, t: tool(i, t), st.text(max_size=8), _texts),
    st.builds(
        lambda t, n: {
            "role": "user",
            "content": [
                {"type": "text", "text": t},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "Q" * n}},
            ],
        },
        _texts,
        st.integers(0, 500),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, max_size=25))
def test_suffix_sums_agree_with_estimating_each_suffix(messages):
    sums = suffix_tokens(messages)
    assert len(sums) == len(messages) + 1
    for i in range(len(messages) + 1):
        assert sums[i] == estimate_tokens(messages[i:])


# ----------------------------------------------------------------------------- boundary


def test_boundary_is_the_earliest_user_turn_whose_suffix_fits():
    messages = history(10)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    budget = estimate_tokens(messages[users[6] :])
    boundary = pick_boundary(messages, keep_tokens=budget)
    assert boundary == users[6]
    assert estimate_tokens(messages[users[5] :]) > budget


def test_boundary_keeps_as_much_verbatim_as_fits():
    messages = history(10)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    # Everything but the first turn fits: the cut is right after it.
    budget = estimate_tokens(messages[users[1] :])
    assert pick_boundary(messages, keep_tokens=budget) == users[1]


def test_a_history_that_fits_the_budget_whole_has_nothing_to_summarize():
    # The seed: the earliest turn that fits is the first one, so nothing comes before it.
    messages = history(10)
    assert pick_boundary(messages, keep_tokens=estimate_tokens(messages[1:])) is None
    assert pick_boundary(messages, keep_tokens=10**9) is None


def test_a_single_turn_that_fits_is_not_cut_inside():
    # Many steps in the one turn, but all of it fits: no cut at an assistant step.
    messages = [SYSTEM, *turn(0, steps=12, result_chars=200)]
    assert pick_boundary(messages, keep_tokens=estimate_tokens(messages[1:])) is None
    assert pick_boundary(messages, keep_tokens=estimate_tokens(messages[1:]) - 1) is not None


def test_assistant_steps_are_cut_at_only_when_the_newest_turn_alone_exceeds_the_budget():
    messages = [*history(3, steps=4, result_chars=500), *turn(3, steps=4, result_chars=500)]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    newest = users[-1]
    # The newest turn fits (just): the cut is at a user message, never inside a turn.
    budget = estimate_tokens(messages[newest:])
    assert pick_boundary(messages, keep_tokens=budget) == newest
    # One token less and only then: inside the newest turn, at an assistant step.
    inside = pick_boundary(messages, keep_tokens=budget - 1)
    assert inside is not None and inside > newest
    assert messages[inside]["role"] == "assistant"


def test_nothing_to_summarize_gives_none():
    assert pick_boundary([], keep_tokens=10) is None
    assert pick_boundary([SYSTEM], keep_tokens=10) is None
    assert pick_boundary([SYSTEM, user("hi")], keep_tokens=0) is None
    assert pick_boundary([user("hi")], keep_tokens=0) is None
    assert pick_boundary([SYSTEM, assistant("no users at all")], keep_tokens=0) is None


def test_boundary_never_leaves_only_the_system_prompt_before_it():
    messages = [SYSTEM, *turn(0)]
    boundary = pick_boundary(messages, keep_tokens=10**9)
    assert boundary is None or any(m["role"] != "system" for m in messages[:boundary])


def test_giant_tool_loop_in_the_newest_turn_is_cut_at_an_iteration_that_fits():
    messages = [*history(3), *turn(3, steps=30, result_chars=2_000)]
    newest_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    budget = 5_000
    assert estimate_tokens(messages[newest_user:]) > budget
    boundary = pick_boundary(messages, keep_tokens=budget)
    assert boundary is not None and boundary > newest_user
    assert messages[boundary]["role"] == "assistant"
    assert estimate_tokens(messages[boundary:]) <= budget
    # earliest-first inside the turn too: one step earlier would not fit
    previous_step = max(
        i for i in range(newest_user + 1, boundary) if messages[i]["role"] == "assistant"
    )
    assert estimate_tokens(messages[previous_step:]) > budget


def test_giant_steps_that_never_fit_keep_the_latest_assistant_step():
    messages = [*history(2), *turn(2, steps=4, result_chars=50_000)]
    boundary = pick_boundary(messages, keep_tokens=100)
    last_assistant = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    assert boundary == last_assistant


def test_latest_step_is_kept_with_its_tool_results():
    messages = [*history(2), user("go"), assistant("", ("big", "shell", {"cmd": "ls"}))]
    messages.append(tool("big", "y" * 100_000))
    boundary = pick_boundary(messages, keep_tokens=100)
    assert messages[boundary]["role"] == "assistant"
    assert messages[boundary:][-1]["role"] == "tool"


def test_huge_newest_user_message_alone_cuts_at_that_message():
    messages = [*history(2), user("p" * 100_000)]
    assert pick_boundary(messages, keep_tokens=100) == len(messages) - 1


def test_giant_first_turn_is_cut_inside_it():
    messages = [SYSTEM, *turn(0, steps=10, result_chars=5_000)]
    boundary = pick_boundary(messages, keep_tokens=3_000)
    assert boundary is not None and boundary > 1
    assert messages[boundary]["role"] == "assistant"


def test_tail_never_starts_with_or_orphans_a_tool_result():
    messages = [*history(4, steps=3, result_chars=300)]
    for budget in range(0, estimate_tokens(messages) + 200, 37):
        boundary = pick_boundary(messages, keep_tokens=budget)
        if boundary is None:
            continue
        assert messages[boundary]["role"] != "tool"
        summarized_calls = {c["id"] for m in messages[:boundary] for c in m.get("tool_calls") or ()}
        tail_results = {m["tool_call_id"] for m in messages[boundary:] if m["role"] == "tool"}
        assert not summarized_calls & tail_results


def test_user_message_between_a_call_and_its_result_is_not_a_cut_point():
    # A message the user sent while a tool was running lands before the tool's result.
    messages = [
        *history(3),
        user("start"),
        assistant("", ("slow", "build", {})),
        user("also check the logs"),
        tool("slow", "ok"),
        assistant("built"),
    ]
    interjection = len(messages) - 3
    budget = estimate_tokens(messages[interjection:])
    boundary = pick_boundary(messages, keep_tokens=budget)
    assert boundary != interjection
    assert boundary is not None and boundary > interjection


def test_single_turn_that_blows_the_budget_keeps_its_latest_step():
    assert pick_boundary([user("hi"), assistant("h" * 1_000)], keep_tokens=0) == 1


def test_repeated_compaction_only_moves_forward():
    messages = history(10)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    budget = estimate_tokens(messages[users[5] :])
    assert pick_boundary(messages, keep_tokens=budget, after=users[4]) == users[5]
    # What came after the prior boundary fits: nothing new to summarize.
    assert pick_boundary(messages, keep_tokens=10**9, after=users[4]) is None
    assert pick_boundary(messages, keep_tokens=0, after=len(messages) - 1) is None


def test_pick_boundary_sizes_each_message_once(monkeypatch):
    calls = 0
    real = compaction._message_chars

    def counting(message):
        nonlocal calls
        calls += 1
        return real(message)

    monkeypatch.setattr(compaction, "_message_chars", counting)
    messages = history(200, steps=2)
    pick_boundary(messages, keep_tokens=500)
    assert calls == len(messages)


# ----------------------------------------------------------------------------- span


def test_span_renders_compact_role_lines():
    span = [
        user("fix the build"),
        {**assistant("looking", ("c1", "shell", {"cmd": "make"})), "reasoning": "SECRET-THOUGHT"},
        tool("c1", "error: missing header"),
        assistant("fixed"),
    ]
    assert render_span(span).splitlines() == [
        "user: fix the build",
        "assistant: looking",
        'assistant → shell({"cmd":"make"})',
        "tool result: error: missing header",
        "assistant: fixed",
    ]


def test_span_skips_system_messages_and_marks_attachments():
    span = [
        SYSTEM,
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see attached"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "file", "file": {"filename": "spec.pdf", "file_data": "data:,x"}},
            ],
        },
    ]
    rendered = render_span(span)
    assert "coworker" not in rendered
    assert "[image]" in rendered and "[file: spec.pdf]" in rendered
    assert "base64" not in rendered


def test_tool_results_are_clipped_to_400_chars():
    rendered = render_span([tool("c", "a" * 399 + "b" * 1_000)])
    assert rendered.startswith("tool result: " + "a" * 399 + "b…")
    assert "b" * 2 not in rendered
    assert "999 more chars" in rendered


def test_short_tool_results_are_not_clipped():
    assert render_span([tool("c", "z" * 400)]) == "tool result: " + "z" * 400


def test_tool_call_arguments_are_clipped():
    rendered = render_span([assistant("", ("c", "write_file", {"body": "q" * 5_000}))])
    assert len(rendered) < 500


def test_over_budget_span_drops_the_oldest_lines_first():
    span = [user(f"message {i:03d} " + "m" * 80) for i in range(100)]
    rendered = render_span(span, budget_chars=2_000)
    assert len(rendered) <= 2_000
    lines = rendered.splitlines()
    assert lines[-1].startswith("user: message 099")
    assert "message 000" not in rendered
    dropped = int(lines[0].strip("[").split()[0])
    assert dropped + len(lines) - 1 == 100


def test_span_within_budget_is_untouched():
    span = [user("a"), assistant("b")]
    assert render_span(span, budget_chars=len("user: a\nassistant: b")) == "user: a\nassistant: b"


def test_single_newest_line_over_budget_is_clipped_to_the_budget():
    rendered = render_span([user("u" * 10_000)], budget_chars=1_000)
    assert len(rendered) <= 1_000
    assert rendered.startswith("user: uuu")


def test_span_to_summarize_starts_at_the_prior_boundary_and_skips_system():
    messages = history(6)
    prior = CompactionState(boundary_index=5, summary="s")
    assert span_to_summarize(messages, boundary=10) == messages[1:10]
    assert span_to_summarize(messages, boundary=10, prior=prior) == messages[5:10]


# ----------------------------------------------------------------------------- summarizer


def test_summarizer_gets_the_prompt_and_the_rendered_span():
    span = [user("deploy it"), assistant("deployed")]
    messages = summarizer_messages(span)
    assert messages == [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
        {"role": "user", "content": "user: deploy it\nassistant: deployed"},
    ]


def test_prior_summary_is_folded_in_first_with_a_label():
    body = summarizer_messages([user("next thing")], prior_summary="OLD SUMMARY")[1]["content"]
    assert body.startswith("[previous compaction summary — fold its still-relevant content")
    assert body.index("OLD SUMMARY") < body.index("[conversation since]")
    assert body.index("[conversation since]") < body.index("user: next thing")


def test_empty_span_still_gives_a_nonempty_user_message():
    assert summarizer_messages([])[1]["content"].strip()


@pytest.mark.parametrize(
    "needle",
    [
        "Primary request and intent",
        "constraint",
        "Key concepts and decisions",
        "reason",
        "Files and resources touched",
        "Errors and fixes",
        "Pending tasks",
        "Current work",
        "Next step",
        "paths",
        "no preamble",
    ],
)
def test_summary_prompt_has_the_seeds_sections_and_rules(needle):
    assert needle.lower() in SUMMARY_SYSTEM_PROMPT.lower()


def test_continuation_contract_forbids_recaps_and_reasking():
    text = CONTINUATION_CONTRACT.lower()
    assert "do not recap" in text and "ask again" in text and "read it again" in text


# ----------------------------------------------------------------------------- state


def test_state_round_trips_through_json():
    state = CompactionState(
        boundary_index=12, summary="S", user_messages=["a", "b"], user_messages_dropped=3
    )
    assert CompactionState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_no_stored_state_is_none():
    assert CompactionState.from_dict(None) is None
    assert CompactionState.from_dict({}) is None


@pytest.mark.parametrize(
    "data",
    [
        {"boundary_index": "3", "summary": "s"},
        {"boundary_index": True, "summary": "s"},
        {"boundary_index": 3, "summary": None},
        {"boundary_index": 3, "summary": "s", "user_messages": [1]},
        {"boundary_index": 3, "summary": "s", "user_messages_dropped": -1},
    ],
)
def test_malformed_state_is_refused(data):
    with pytest.raises(ValueError):
        CompactionState.from_dict(data)


def test_compact_preserves_the_user_messages_of_the_span():
    messages = history(5)
    boundary = pick_boundary(messages, keep_tokens=60)
    state = compact(messages, summary="S", boundary=boundary)
    expected = [m["content"] for m in messages[:boundary] if m["role"] == "user"]
    assert state.user_messages == expected
    assert state.boundary_index == boundary
    assert state.user_messages_dropped == 0


def test_preserved_user_messages_are_clipped_to_600_chars_with_a_marker():
    messages = [SYSTEM, user("k" * 600), assistant("ok"), user("p" * 5_000), assistant("ok")]
    messages.append(user("now"))
    state = compact(messages, summary="S", boundary=5)
    assert state.user_messages[0] == "k" * 600
    assert state.user_messages[1].startswith("p" * 600 + "…")
    assert "4400 more chars" in state.user_messages[1]
    assert len(state.user_messages[1]) < 640


def test_preserved_list_keeps_the_newest_40_and_counts_the_rest():
    messages = history(50)
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    state = compact(messages, summary="S", boundary=last_user)
    assert len(state.user_messages) == 40
    assert state.user_messages[-1] == "request 48"
    assert state.user_messages[0] == "request 9"
    assert state.user_messages_dropped == 9


def test_dropped_count_accumulates_across_compactions():
    messages = history(80)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    first = compact(messages, summary="S1", boundary=users[45])
    assert first.user_messages_dropped == 5
    second = compact(messages, summary="S2", boundary=users[70], prior=first)
    assert second.summary == "S2"
    assert len(second.user_messages) == 40
    assert second.user_messages[-1] == "request 69"
    assert second.user_messages_dropped == 30  # 70 summarized so far, 40 kept


def test_repeated_compaction_does_not_duplicate_user_messages():
    messages = history(10)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    first = compact(messages, summary="S1", boundary=users[3])
    second = compact(messages, summary="S2", boundary=users[6], prior=first)
    assert second.user_messages == [f"request {n}" for n in range(6)]


def test_compact_refuses_a_boundary_that_summarizes_nothing_or_goes_back():
    messages = history(4)
    with pytest.raises(ValueError):
        compact(messages, summary="S", boundary=0)
    with pytest.raises(ValueError):
        compact(messages, summary="S", boundary=len(messages))
    prior = CompactionState(boundary_index=8, summary="S")
    with pytest.raises(ValueError):
        compact(messages, summary="S", boundary=8, prior=prior)


def test_compact_does_not_mutate_the_prior_state():
    messages = history(10)
    prior = compact(messages, summary="S1", boundary=5)
    snapshot = copy.deepcopy(prior)
    compact(messages, summary="S2", boundary=20, prior=prior)
    assert prior == snapshot


# ----------------------------------------------------------------------------- block


def test_block_has_summary_user_messages_and_contract_in_order():
    state = CompactionState(
        boundary_index=9, summary="THE SUMMARY", user_messages=["first ask", "second ask"]
    )
    block = compacted_block(state)
    order = [block.index(s) for s in ("THE SUMMARY", "first ask", "second ask")]
    assert order == sorted(order)
    assert block.endswith(CONTINUATION_CONTRACT)
    assert "omitted" not in block


def test_block_counts_omitted_user_messages():
    state = CompactionState(
        boundary_index=9, summary="S", user_messages=["x"], user_messages_dropped=7
    )
    assert (
        "(7 earlier user messages omitted — their intent is covered by the summary above)"
        in compacted_block(state)
    )


def test_block_is_byte_stable_between_turns():
    messages = history(50)
    state = compact(messages, summary="S", boundary=100)
    restored = CompactionState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert compacted_block(state).encode() == compacted_block(restored).encode()
    grown = [*messages, *turn(99)]
    view_before = apply_to_outbound(messages, state)
    view_after = apply_to_outbound(grown, state)
    assert view_after[: len(view_before)] == view_before


def test_multiline_user_messages_stay_inside_their_bullet():
    block = compacted_block(CompactionState(1, "S", user_messages=["line one\nline two"]))
    assert "- line one\n  line two" in block


# ----------------------------------------------------------------------------- outbound


def test_outbound_is_system_block_then_verbatim_tail():
    messages = history(6)
    state = compact(messages, summary="S", boundary=13)
    out = apply_to_outbound(messages, state)
    assert out[0] is messages[0]
    assert out[1] == {"role": "user", "content": compacted_block(state)}
    assert out[2:] == messages[13:]


def test_outbound_without_a_system_prompt_starts_with_the_block():
    messages = history(6)[1:]
    state = compact(messages, summary="S", boundary=12)
    out = apply_to_outbound(messages, state)
    assert out[0]["content"] == compacted_block(state)
    assert out[1:] == messages[12:]


def test_user_tail_after_the_block_stays_a_separate_message():
    messages = history(6)
    state = compact(messages, summary="S", boundary=13)
    assert messages[13]["role"] == "user"
    out = apply_to_outbound(messages, state)
    assert [m["role"] for m in out[:3]] == ["system", "user", "user"]
    assert out[2] is messages[13]


def test_no_state_is_a_no_op_copy():
    messages = history(2)
    out = apply_to_outbound(messages, None)
    assert out == messages and out is not messages


@pytest.mark.parametrize("boundary", [0, -3, 9, 50])
def test_stale_state_is_a_no_op(boundary):
    messages = history(2)
    assert len(messages) == 9
    assert apply_to_outbound(messages, CompactionState(boundary, "S")) == messages


def test_outbound_never_mutates_the_history():
    messages = history(6)
    messages[3]["extras"] = {"_gemini": {"sig": "abc"}}
    before = copy.deepcopy(messages)
    state = compact(messages, summary="S", boundary=13)
    out = apply_to_outbound(messages, state)
    out.append(user("appended to the view"))
    assert messages == before


def test_sidecars_of_the_summarized_span_vanish_with_it():
    messages = history(6)
    messages[3]["extras"] = {"_gemini": {"sig": "SIGNATURE-IN-SPAN"}}
    state = compact(messages, summary="S", boundary=13)
    assert "SIGNATURE-IN-SPAN" not in json.dumps(apply_to_outbound(messages, state))
