"""Embedded mode's channel layer (openworker/runtime/live/memory_layer.py): Channels'
in-memory layer semantics, without a walk of every socket per message."""

from __future__ import annotations

import asyncio

from openworker.runtime.live.memory_layer import LocalChannelLayer


def test_group_send_nowait_delivers_a_copy_to_every_member_in_order():
    async def scenario() -> None:
        layer = LocalChannelLayer()
        one, two = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("session.a", one)
        await layer.group_add("session.a", two)
        await layer.group_add("session.b", two)
        message = {"type": "event", "event": {"seq": 1}}
        sent = layer.group_send_nowait("session.a", message)
        assert sent.done() and sent.exception() is None
        await layer.group_send("session.a", {"type": "event", "event": {"seq": 2}})
        message["event"]["seq"] = 99  # the sender's dict is not what members hold
        for channel in (one, two):
            first, second = await layer.receive(channel), await layer.receive(channel)
            assert [first["event"]["seq"], second["event"]["seq"]] == [1, 2]
        layer.group_send_nowait("session.b", {"type": "event", "event": {"seq": 3}})
        assert (await layer.receive(two))["event"]["seq"] == 3

    asyncio.run(scenario())


def test_a_full_member_queue_drops_the_message_and_the_others_still_get_it():
    async def scenario() -> None:
        layer = LocalChannelLayer(capacity=1)
        slow, fast = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("g", slow)
        await layer.group_add("g", fast)
        layer.group_send_nowait("g", {"type": "event", "n": 1})
        assert (await layer.receive(fast))["n"] == 1
        layer.group_send_nowait("g", {"type": "event", "n": 2})  # slow's queue is full
        assert (await layer.receive(fast))["n"] == 2
        assert (await layer.receive(slow))["n"] == 1
        assert layer.channels.get(slow) is None  # nothing else waited for it

    asyncio.run(scenario())


def test_expired_messages_are_still_cleaned_up_and_their_channel_leaves_its_groups():
    async def scenario() -> None:
        layer = LocalChannelLayer(expiry=0)
        gone, live = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("g", gone)
        layer.group_send_nowait("g", {"type": "event"})
        layer._next_clean = 0.0  # the next call cleans (at most once per CLEAN_SECONDS)
        await layer.group_add("g", live)
        layer.group_send_nowait("g", {"type": "event", "n": 2})
        assert gone not in layer.groups.get("g", {})
        assert (await layer.receive(live))["n"] == 2

    asyncio.run(scenario())


def test_every_member_gets_its_own_copy_of_nested_lists_and_dicts():
    async def scenario() -> None:
        layer = LocalChannelLayer()
        one, two = await layer.new_channel(), await layer.new_channel()
        for channel in (one, two):
            await layer.group_add("session.a", channel)
        message = {
            "type": "event",
            "event": {"seq": 1, "message": {"content": [{"type": "text", "text": "hi"}]}},
            "extra": ("a", ["b"]),  # not a JSON shape: deep-copied the standard way
        }
        layer.group_send_nowait("session.a", message)
        got_one, got_two = await layer.receive(one), await layer.receive(two)
        got_one["event"]["message"]["content"][0]["text"] = "changed"
        got_one["extra"][1].append("c")
        assert got_two == message
        assert message["event"]["message"]["content"][0]["text"] == "hi"
        assert message["extra"] == ("a", ["b"])

    asyncio.run(scenario())
