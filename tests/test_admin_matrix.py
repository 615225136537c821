"""The curated matrix table: seeded small, read by the provider layer through a cache
that every change invalidates, restricted per team, managed in the admin."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group

from openworker.runtime.agent.llm import router_for_user
from providers.edge import matrix
from providers.edge.matrix import curated_matrix
from providers.edge.models import MatrixModel
from providers.types import TokenUsage

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_matrix_cache():
    matrix.invalidate()
    yield
    matrix.invalidate()


def test_the_seed_is_small_tool_calling_and_leaves_unknowns_empty():
    rows = list(MatrixModel.objects.all())
    assert 1 <= len(rows) <= 6
    assert all(row.tools for row in rows)
    assert all(":" in row.model_id for row in rows)
    haiku = MatrixModel.objects.get(model_id="anthropic:claude-haiku-4-5")
    assert haiku.price_cache_read is None and haiku.price_cache_write is None


def test_rows_become_curated_models_with_capabilities_and_prices():
    MatrixModel.objects.create(
        model_id="together:zai-org/GLM-5.2",
        label="GLM 5.2",
        provider="together",
        tools=True,
        context_window=200_000,
        price_input=Decimal("1.5"),
        price_output=Decimal("4"),
    )
    entry = curated_matrix()["together:zai-org/GLM-5.2"]
    assert entry.caps.tools is True and entry.caps.curated is True
    assert entry.caps.vision is None  # empty means unknown, not False
    assert entry.caps.context_window == 200_000
    cost = entry.prices.cost(TokenUsage(input=1_000_000, output=500_000))
    assert cost == Decimal("3.5")


def test_the_router_reads_capabilities_from_the_table_and_heuristics_otherwise(owner):
    MatrixModel.objects.create(
        model_id="ollama:qwen3:32b",
        label="Qwen",
        provider="ollama",
        tools=True,
        context_window=40_960,
    )
    router = router_for_user(owner.pk)
    assert router.capabilities("ollama:qwen3:32b").context_window == 40_960
    assert router.capabilities("ollama:qwen3:32b").curated is True
    custom = router.capabilities("ollama:qwen3:14b")
    assert custom.curated is False and custom.context_window is None


def test_an_edit_is_seen_on_the_next_read_without_waiting_for_expiry():
    row = MatrixModel.objects.create(
        model_id="openai:gpt-test", label="T", provider="openai", context_window=1000
    )
    assert curated_matrix()["openai:gpt-test"].caps.context_window == 1000
    row.context_window = 2000
    row.save()
    assert curated_matrix()["openai:gpt-test"].caps.context_window == 2000
    row.delete()
    assert "openai:gpt-test" not in curated_matrix()


def test_reads_are_served_from_the_cache_until_a_change(django_assert_num_queries):
    curated_matrix()
    with django_assert_num_queries(0):
        curated_matrix()
        curated_matrix()


def test_a_disabled_row_still_answers_capabilities():
    MatrixModel.objects.create(
        model_id="openai:gpt-old", label="Old", provider="openai", enabled=False, vision=True
    )
    assert curated_matrix()["openai:gpt-old"].caps.vision is True


def test_team_restricted_models_are_offered_only_to_that_team(owner, teammate):
    MatrixModel.objects.all().delete()
    team = Group.objects.create(name="research")
    everyone = MatrixModel.objects.create(model_id="openai:a", label="A", provider="openai")
    restricted = MatrixModel.objects.create(model_id="openai:b", label="B", provider="openai")
    restricted.groups.add(team)
    MatrixModel.objects.create(model_id="openai:c", label="C", provider="openai", enabled=False)
    owner.groups.add(team)
    assert matrix.models_for_user(owner) == [everyone, restricted]
    assert matrix.models_for_user(teammate) == [everyone]


def test_admin_lists_and_edits_the_matrix(admin_client):
    page = admin_client.get("/admin/providers/matrixmodel/")
    assert page.status_code == 200
    assert b"anthropic:claude-sonnet-5" in page.content
    response = admin_client.post(
        "/admin/providers/matrixmodel/add/",
        {
            "model_id": "anthropic:claude-new",
            "label": "New",
            "provider": "anthropic",
            "enabled": "on",
            "order": "5",
            "tools": "true",
            "vision": "unknown",
            "pdf": "unknown",
            "reasoning": "unknown",
            "thinking": "",
        },
    )
    assert response.status_code == 302, response.content
    assert curated_matrix()["anthropic:claude-new"].caps.tools is True


def test_admin_refuses_a_provider_that_contradicts_the_id_prefix(admin_client):
    response = admin_client.post(
        "/admin/providers/matrixmodel/add/",
        {"model_id": "anthropic:claude-x", "label": "X", "provider": "openai", "order": "0"},
    )
    assert response.status_code == 200
    assert not MatrixModel.objects.filter(model_id="anthropic:claude-x").exists()


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_version_checks_from_many_turns_share_one_redis_connection() -> None:
    """Each turn runs in an async context of its own, where Django's `cache` is a new
    client, and so a new Redis connection, per context: the version check must not be."""
    import asyncio
    import contextvars

    import redis
    from asgiref.sync import async_to_sync, sync_to_async
    from django.conf import settings

    server = redis.Redis.from_url(settings.REDIS_URL)

    def connections_made() -> int:
        return int(server.info("stats")["total_connections_received"])

    curated_matrix()
    before = connections_made()

    async def turns() -> None:
        async def one_turn() -> None:
            await sync_to_async(curated_matrix, thread_sensitive=False)()

        for _ in range(30):  # one after another: a pool needs one connection for them
            await asyncio.create_task(one_turn(), context=contextvars.Context())

    async_to_sync(turns)()
    assert connections_made() - before <= 1
