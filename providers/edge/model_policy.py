"""The one server-side model policy: may this user run this model, and on whose key?

Every place a model can be chosen or used asks here: the pickers (new session, default
model, mid-session switch), the websocket send, the import, and the engine before any
model call of a turn (which covers regenerate/retry, titling and compaction). The
pages only offer what this allows; the server refuses the rest with `ModelRefused`,
whose message says why.

The rule:
- A curated model the user may pick (enabled, and offered to everyone or to one of the
  user's teams: `providers.edge.matrix.models_for_user`) runs on any key, the organisation's
  included.
- Any other id (a custom model, or a curated one hidden from the user's teams or
  disabled) is governed by the user's teams' `TeamModelPolicy`, the most permissive one
  winning; a user whose teams set none gets `settings.CUSTOM_MODELS_DEFAULT`:
  `off` refuses it, `own_key` runs it on the user's own provider settings only (the
  organisation's keys never serve it), `any_key` runs it on the organisation's keys too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from openworker.prepared_query import AnyOf, PreparedQuery
from providers.capabilities import split_model
from providers.edge.models import MatrixModel, ProviderProfile, TeamModelPolicy

Custom = TeamModelPolicy.Custom
# Most permissive last: a member of several teams gets the widest of their policies.
_RANK = {Custom.OFF: 0, Custom.OWN_KEY: 1, Custom.ANY_KEY: 2}
# A model id longer than this is not one (the Session.model column is 200 wide).
MAX_MODEL_ID_CHARS = 200


class ModelRefused(Exception):
    """The user may not run this model; the message is for the page."""


@dataclass(frozen=True)
class ModelDecision:
    model: str
    allowed: bool
    # May the organisation's provider keys serve it (else only the user's own profile).
    org_keys: bool
    curated: bool
    reason: str = ""


def custom_mode(*, user: Any) -> str:
    """The user's effective custom-model policy: the widest among their teams'."""
    modes = list(
        TeamModelPolicy.objects.filter(team__in=user.groups.all()).values_list(
            "custom_models", flat=True
        )
    )
    if not modes:
        return settings.CUSTOM_MODELS_DEFAULT
    return max(modes, key=lambda mode: _RANK.get(mode, 0))


@dataclass(frozen=True)
class _Facts:
    curated: bool
    mode: str
    own_profile: bool


def _facts_query(user_id: int, model: str, provider: str) -> QuerySet:
    return _annotated_facts(get_user_model().objects.filter(pk=user_id), model, provider)[:1]


def _facts_query_many(user_ids: list[int], model: str, provider: str) -> QuerySet:
    """(user id, then `_facts_query`'s columns) of each of `user_ids`."""
    users = get_user_model().objects.filter(AnyOf(F("pk"), user_ids))
    return _annotated_facts(users, model, provider, leading=("pk",))


def _annotated_facts(
    users: QuerySet, model: str, provider: str, leading: tuple[str, ...] = ()
) -> QuerySet:
    user = OuterRef("pk")
    policies = TeamModelPolicy.objects.filter(team__user=user)
    return users.annotate(
        curated=Exists(
            MatrixModel.objects.filter(
                Q(groups__isnull=True) | Q(groups__user=user), model_id=model, enabled=True
            )
        ),
        any_key=Exists(policies.filter(custom_models=Custom.ANY_KEY)),
        own_key=Exists(policies.filter(custom_models=Custom.OWN_KEY)),
        any_policy=Exists(policies),
        own_profile=Exists(ProviderProfile.objects.filter(owner=user, provider=provider)),
    ).values_list(*leading, "curated", "any_key", "own_key", "any_policy", "own_profile")


# Compiled once: building this query's SQL cost seven times running it (openworker.prepared_query).
_FACTS = PreparedQuery(_facts_query, user_id=int, model=str, provider=str)
# A batch's (of any size): compiling it was most of a burst's policy check.
_FACTS_MANY = PreparedQuery(_facts_query_many, user_ids=list[int], model=str, provider=str)


def _facts(user_id: int, model: str, provider: str) -> _Facts:
    """What the decision needs, in one query on the user's row: whether `model` is an
    enabled curated model offered to everyone or to one of the user's teams
    (`models_for_user`'s rule), the widest custom-model policy of their teams, and
    whether they have their own settings for `provider`. It runs on every send and before
    every turn's first model call: three queries and a user fetch were a third of a
    send's CPU (bench/stream_path.py). DoesNotExist for an unknown user."""
    row = _FACTS.first(user_id=user_id, model=model, provider=provider)
    if row is None:
        raise get_user_model().DoesNotExist(f"no user {user_id}")
    return _facts_of(row)


def _facts_of(row: Any) -> _Facts:
    curated, any_key, own_key, any_policy, own_profile = row
    if not any_policy:
        mode = settings.CUSTOM_MODELS_DEFAULT
    else:
        mode = Custom.ANY_KEY if any_key else Custom.OWN_KEY if own_key else Custom.OFF
    return _Facts(bool(curated), mode, bool(own_profile))


def model_decide(*, user: Any, model: str, check_own_key: bool = True) -> ModelDecision:
    """The decision for `user` running `model`."""
    return _decide(user.pk, model, check_own_key)


def _decide(user_id: int, model: str, check_own_key: bool) -> ModelDecision:
    """The decision for the user `user_id` running `model`.

    `check_own_key`: when only the user's own key may serve the model, refuse unless they
    have settings for its provider. The engine skips it when the turn's provider was
    injected (tests and benchmarks bring their own credentials).
    """
    model = (model or "").strip()
    malformed = _malformed(model)
    if malformed is not None:
        return malformed
    provider = split_model(model, default_provider=settings.DEFAULT_PROVIDER)[0]
    return _decision(model, provider, _facts(user_id, model, provider), check_own_key)


def model_decide_many(
    pairs: list[tuple[int, str]], *, check_own_key: bool = True
) -> list[ModelDecision]:
    """`model_decide` for many (user id, model) pairs, in order (a burst of sends or of
    turn starts): one query per distinct model, not one per pair. A pair whose user is
    unknown is refused."""
    decisions: list[ModelDecision | None] = [None] * len(pairs)
    wanted: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for index, (user_id, raw) in enumerate(pairs):
        model = (raw or "").strip()
        decisions[index] = _malformed(model)
        if decisions[index] is None:
            provider = split_model(model, default_provider=settings.DEFAULT_PROVIDER)[0]
            wanted.setdefault((model, provider), []).append((index, user_id))
    for (model, provider), asking in wanted.items():
        found: dict[int, _Facts] = {}
        if len(asking) == 1:  # a lone send: the query compiled once
            row = _FACTS.first(user_id=asking[0][1], model=model, provider=provider)
            if row is not None:
                found[asking[0][1]] = _facts_of(row)
        else:
            users = [user_id for _, user_id in asking]
            found = {
                row[0]: _facts_of(row[1:])
                for row in _FACTS_MANY.rows(user_ids=users, model=model, provider=provider)
            }
        for index, user_id in asking:
            facts = found.get(user_id)
            decisions[index] = (
                _decision(model, provider, facts, check_own_key)
                if facts is not None
                else ModelDecision(model, False, False, False, "Unknown user.")
            )
    return [decision for decision in decisions if decision is not None]


def _malformed(model: str) -> ModelDecision | None:
    """The refusal of a model id that is none (empty, too long), else None."""
    if not model:
        return ModelDecision(model, False, False, False, "Choose a model.")
    if len(model) > MAX_MODEL_ID_CHARS:
        return ModelDecision(
            model[:MAX_MODEL_ID_CHARS],
            False,
            False,
            False,
            f"Model ids are at most {MAX_MODEL_ID_CHARS} characters.",
        )
    return None


def _decision(model: str, provider: str, facts: _Facts, check_own_key: bool) -> ModelDecision:
    if facts.curated:
        return ModelDecision(model, True, True, True)
    if facts.mode == Custom.ANY_KEY:
        return ModelDecision(model, True, True, False)
    if facts.mode == Custom.OWN_KEY:
        if check_own_key and not facts.own_profile:
            return ModelDecision(
                model,
                False,
                False,
                False,
                f"{model} is not one of your team's models, so it runs only on your own "
                f"{provider} key: add one under Settings, or pick a model from the list.",
            )
        return ModelDecision(model, True, False, False)
    return ModelDecision(
        model,
        False,
        False,
        False,
        f"{model} is not one of your team's models, and your team may use only those; "
        "pick one from the list or ask an admin.",
    )


def model_require(*, user: Any, model: str, check_own_key: bool = True) -> ModelDecision:
    """`model_decide`, raising `ModelRefused` with the reason when it is refused."""
    return _allowed(_decide(user.pk, model, check_own_key))


def model_require_for_user_id(
    *, user_id: int, model: str, check_own_key: bool = True
) -> ModelDecision:
    """`model_require` for a user known by id (the engine's database threads)."""
    return _allowed(_decide(user_id, model, check_own_key))


def _allowed(decision: ModelDecision) -> ModelDecision:
    if not decision.allowed:
        raise ModelRefused(decision.reason)
    return decision


def model_decide_for_user_id(
    *, user_id: int, model: str, check_own_key: bool = True
) -> ModelDecision:
    """`model_decide` for a user known by id."""
    return _decide(user_id, model, check_own_key)
