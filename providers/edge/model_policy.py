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
from django.db.models import Exists, OuterRef, Q, QuerySet

from openworker.prepared_query import PreparedQuery
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
    user = OuterRef("pk")
    policies = TeamModelPolicy.objects.filter(team__user=user)
    return (
        get_user_model()
        .objects.filter(pk=user_id)
        .annotate(
            curated=Exists(
                MatrixModel.objects.filter(
                    Q(groups__isnull=True) | Q(groups__user=user), model_id=model, enabled=True
                )
            ),
            any_key=Exists(policies.filter(custom_models=Custom.ANY_KEY)),
            own_key=Exists(policies.filter(custom_models=Custom.OWN_KEY)),
            any_policy=Exists(policies),
            own_profile=Exists(ProviderProfile.objects.filter(owner=user, provider=provider)),
        )
        .values_list("curated", "any_key", "own_key", "any_policy", "own_profile")[:1]
    )


# Compiled once: building this query's SQL cost seven times running it (openworker.prepared_query).
_FACTS = PreparedQuery(_facts_query, user_id=int, model=str, provider=str)


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
    provider = split_model(model, default_provider=settings.DEFAULT_PROVIDER)[0]
    facts = _facts(user_id, model, provider)
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
