"""The one model policy (providers.model_policy) at every place a model is chosen or used:
new session, default model, mid-session switch, the websocket send, a retry, titling, and
which keys the engine's router may use."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.urls import reverse

from providers.edge.model_policy import custom_mode, model_decide, model_decide_many
from providers.edge.models import MatrixModel, ProviderProfile, TeamModelPolicy
from providers.edge.secret_store import UserSecretStore
from sessions.models import Message, Session, Turn, UserPreferences
from tests.fakes import AnthropicMessagesFake, Reply, text, usage
from tests.support.chat import point_provider_at, read_until_status
from tests.test_engine_embedded import open_socket

HIDDEN = "anthropic:claude-hidden-1"
OFFERED = "anthropic:claude-offered-1"
CUSTOM = "anthropic:claude-custom-1"


@pytest.fixture
def matrix(db):  # type: ignore[no-untyped-def]
    """A model offered to everyone and one restricted to a team the owner is not in."""
    others = Group.objects.create(name="others")
    MatrixModel.objects.create(model_id=OFFERED, label="Offered", provider="anthropic")
    hidden = MatrixModel.objects.create(model_id=HIDDEN, label="Hidden", provider="anthropic")
    hidden.groups.add(others)
    return others


def org_key(base_url: str = "https://api.anthropic.invalid") -> ProviderProfile:
    profile = ProviderProfile(owner=None, provider="anthropic", base_url=base_url)
    profile.set_api_key("sk-org-key-0000")
    profile.save()
    return profile


def team_policy(user, mode: str, name: str = "team") -> Group:  # type: ignore[no-untyped-def]
    team = Group.objects.create(name=name)
    user.groups.add(team)
    TeamModelPolicy.objects.create(team=team, custom_models=mode)
    return team


# --- the decision ------------------------------------------------------------------------


@pytest.mark.django_db
def test_decisions_for_many_users_at_once_equal_each_decided_alone(owner, teammate, matrix):
    """A burst of sends asks the policy for many users together: the same answers, one
    query per model asked for."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    org_key()
    point_provider_at(owner, "anthropic", "https://mine.invalid")
    team_policy(teammate, TeamModelPolicy.Custom.OFF)
    third = get_user_model().objects.create_user("carol", password=None)
    team_policy(third, TeamModelPolicy.Custom.ANY_KEY, name="wide")
    pairs = [
        (user.pk, model) for model in (OFFERED, HIDDEN, CUSTOM) for user in (owner, teammate, third)
    ] + [(owner.pk, "  "), (owner.pk, "x" * 500), (10**9, OFFERED)]
    with CaptureQueriesContext(connection) as queries:
        together = model_decide_many(pairs)
    assert len(queries.captured_queries) == 3  # one per well-formed model id
    alone = [model_decide(user=get_user_model()(pk=user_id), model=m) for user_id, m in pairs[:-1]]
    assert together[:-1] == alone
    assert {d.allowed for d in together[:9]} == {True, False}  # the mix is a real one
    assert not together[-1].allowed and together[-1].reason == "Unknown user."


@pytest.mark.django_db
def test_a_curated_model_offered_to_the_user_runs_on_the_organisations_key(owner, matrix):
    decision = model_decide(user=owner, model=OFFERED)
    assert decision.allowed and decision.org_keys and decision.curated


@pytest.mark.django_db
def test_a_hidden_model_typed_as_custom_is_refused_without_an_own_key(owner, matrix):
    org_key()
    decision = model_decide(user=owner, model=HIDDEN)
    assert not decision.allowed
    assert "own anthropic key" in decision.reason


@pytest.mark.django_db
def test_with_an_own_key_a_custom_model_runs_but_never_on_the_organisations(owner, matrix):
    org_key()
    point_provider_at(owner, "anthropic", "https://mine.invalid")
    decision = model_decide(user=owner, model=HIDDEN)
    assert decision.allowed and not decision.org_keys


@pytest.mark.django_db
def test_a_team_that_allows_custom_models_on_the_organisations_keys(owner, matrix):
    team_policy(owner, TeamModelPolicy.Custom.ANY_KEY)
    decision = model_decide(user=owner, model=CUSTOM)
    assert decision.allowed and decision.org_keys


@pytest.mark.django_db
def test_a_team_without_custom_models_refuses_them_even_on_an_own_key(owner, matrix):
    team_policy(owner, TeamModelPolicy.Custom.OFF)
    point_provider_at(owner, "anthropic", "https://mine.invalid")
    decision = model_decide(user=owner, model=CUSTOM)
    assert not decision.allowed
    assert "may use only those" in decision.reason
    assert model_decide(user=owner, model=OFFERED).allowed


@pytest.mark.django_db
def test_the_widest_policy_of_the_users_teams_wins(owner):
    team_policy(owner, TeamModelPolicy.Custom.OFF, name="a")
    team_policy(owner, TeamModelPolicy.Custom.ANY_KEY, name="b")
    assert custom_mode(user=owner) == "any_key"


@pytest.mark.django_db
def test_the_site_default_applies_to_users_whose_teams_set_nothing(owner, settings):
    settings.CUSTOM_MODELS_DEFAULT = "off"
    assert custom_mode(user=owner) == "off"
    assert not model_decide(user=owner, model=CUSTOM).allowed


@pytest.mark.django_db
def test_a_secret_store_without_organisation_keys_holds_only_the_users_own(owner):
    org_key()
    assert UserSecretStore(owner.pk).get("provider:anthropic")["scope"] == "organisation"
    assert UserSecretStore(owner.pk, org_keys=False).get("provider:anthropic") is None


# --- the pages ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_new_session_with_a_hidden_model_is_refused_in_the_page(client, owner, matrix):
    org_key()
    client.force_login(owner)
    response = client.post(
        reverse("session_new"), {"model": "__custom__", "custom_model": HIDDEN}, follow=True
    )
    assert not Session.objects.filter(owner=owner).exists()
    assert "not one of your team&#x27;s models" in response.content.decode()


@pytest.mark.django_db
def test_switching_to_a_refused_model_says_why_and_keeps_the_old_one(client, owner, matrix):
    session = Session.objects.create(owner=owner, model=OFFERED)
    client.force_login(owner)
    response = client.post(
        reverse("session_model", args=[session.pk]), {"model": "__custom__", "custom_model": HIDDEN}
    )
    assert response.status_code == 400
    assert "own anthropic key" in response.json()["error"]
    session.refresh_from_db()
    assert session.model == OFFERED


@pytest.mark.django_db
def test_a_refused_default_model_is_not_saved(client, owner, matrix):
    team_policy(owner, TeamModelPolicy.Custom.OFF)
    client.force_login(owner)
    response = client.post(
        reverse("provider_default_model"),
        {"model": "__custom__", "custom_model": CUSTOM},
        follow=True,
    )
    assert not UserPreferences.objects.filter(user=owner).exclude(default_model="").exists()
    assert "may use only those" in response.content.decode()


@pytest.mark.django_db
def test_the_picker_offers_no_custom_model_when_the_team_allows_none(client, owner, matrix):
    team_policy(owner, TeamModelPolicy.Custom.OFF)
    client.force_login(owner)
    body = client.get(reverse("home")).content.decode()
    assert OFFERED in body and HIDDEN not in body
    assert 'value="__custom__"' not in body


@pytest.mark.django_db
def test_a_connection_test_with_a_hidden_model_never_reaches_the_organisations_key(
    client, owner, matrix
):
    with AnthropicMessagesFake(api_key=None) as org_fake:
        org_key(org_fake.base_url)
        client.force_login(owner)
        response = client.post(
            reverse("provider_test", args=["anthropic"]), {"model": HIDDEN}, follow=True
        )
        assert "own anthropic key" in response.content.decode()
        assert org_fake.requests == []


# --- the socket and the engine -----------------------------------------------------------


@pytest.fixture
def fake():
    with AnthropicMessagesFake(api_key=None) as server:
        yield server


@pytest.mark.django_db(transaction=True)
async def test_a_socket_send_naming_a_hidden_model_gets_an_error_and_no_turn(owner, fake):
    await sync_to_async(_matrix_and_org_key)(fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=OFFERED)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "hi", "model": HIDDEN})
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error" and "own anthropic key" in error["error"]
    assert not await Turn.objects.filter(session=session).aexists()
    # The socket still works: the offered model runs on the organisation's key.
    fake.push(Reply(text("Hello."), usage(input=5, output=2)))
    await ws.send_json_to({"type": "send", "text": "hi"})
    events = await read_until_status(ws)
    assert events[-1]["status"] == "completed", str(events[-1])
    assert fake.requests[-1].headers.get("x-api-key") == "sk-org-key-0000"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_retrying_a_turn_whose_model_was_hidden_fails_with_the_reason(owner, fake):
    await sync_to_async(_matrix_and_org_key)(fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=HIDDEN)
    turn = await Turn.objects.acreate(session=session, model=HIDDEN, status=Turn.Status.FAILED)
    await Message.objects.acreate(session=session, seq=1, turn=turn, role="user", content="hi")
    await Session.objects.filter(pk=session.pk).aupdate(next_seq=2)
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "retry", "turn": str(turn.pk)})
    events = await read_until_status(ws)
    assert events[-1]["status"] == "failed"
    assert events[-1]["error_kind"] == "model_refused"
    assert "own anthropic key" in events[-1]["error"]
    assert fake.requests == []  # the organisation's key never saw the hidden model
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_custom_model_on_an_own_key_never_reaches_the_organisations_key(owner, fake):
    with AnthropicMessagesFake(api_key=None) as org_fake:
        await sync_to_async(_matrix_and_org_key)(org_fake.base_url)
        await sync_to_async(point_provider_at)(owner, "anthropic", fake.base_url, "sk-mine-1111")
        session = await Session.objects.acreate(owner=owner, model=CUSTOM)
        fake.push(Reply(text("Mine."), usage(input=5, output=2)))
        ws = await open_socket(owner, session)
        await ws.send_json_to({"type": "send", "text": "hi"})
        events = await read_until_status(ws)
        assert events[-1]["status"] == "completed", str(events[-1])
        assert fake.requests[-1].headers.get("x-api-key") == "sk-mine-1111"
        assert org_fake.requests == []
        await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_title_model_the_policy_refuses_is_not_asked(owner, fake, settings):
    settings.AUTO_TITLE = True
    settings.TITLE_MODEL = HIDDEN
    await sync_to_async(_matrix_and_org_key)(fake.base_url)
    session = await Session.objects.acreate(owner=owner, model=OFFERED)
    fake.push(Reply(text("Hello."), usage(input=5, output=2)))
    ws = await open_socket(owner, session)
    await ws.send_json_to({"type": "send", "text": "plan the quarterly review"})
    events = await read_until_status(ws)
    assert events[-1]["status"] == "completed", str(events[-1])
    title = await ws.receive_json_from(timeout=5)
    while title.get("type") != "session.title":
        title = await ws.receive_json_from(timeout=5)
    assert title["title"] == "plan the quarterly review"  # the fallback: no model call
    assert len(fake.requests) == 1
    assert all(HIDDEN.split(":", 1)[1] not in str(r.body) for r in fake.requests)
    await ws.disconnect()


def _matrix_and_org_key(base_url: str) -> None:
    others = Group.objects.create(name="others")
    MatrixModel.objects.create(model_id=OFFERED, label="Offered", provider="anthropic")
    hidden = MatrixModel.objects.create(model_id=HIDDEN, label="Hidden", provider="anthropic")
    hidden.groups.add(others)
    org_key(base_url)


def test_a_first_run_with_no_key_and_an_uncurated_site_default_starts_on_a_curated_model(
    client, owner, settings
):
    """No key anywhere and a site default the team may not pick (the admin removed it):
    the new session starts on the first curated model, so the user lands in the composer
    (which says where the key goes) instead of a refusal."""
    MatrixModel.objects.all().delete()
    MatrixModel.objects.create(model_id=OFFERED, label="Offered", provider="anthropic")
    settings.DEFAULT_MODEL = "openai:not-curated-here"
    client.force_login(owner)
    home = client.get(reverse("home")).content.decode()
    assert re.search(rf'<option value="{OFFERED}"[^>]* selected>', home)
    response = client.post(reverse("session_new"))
    assert response.status_code == 302 and "/sessions/" in response["Location"]
    assert Session.objects.get(owner=owner).model == OFFERED
