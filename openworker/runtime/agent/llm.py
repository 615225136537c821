"""How the agent reaches the provider layer: one router per turn for the session's
owner, reading that user's profiles (then the organisation's) from the SecretStore."""

from __future__ import annotations

from django.conf import settings

from providers.capabilities import CuratedModel
from providers.edge.matrix import curated_matrix
from providers.edge.secret_store import UserSecretStore
from providers.factory import preload_wire_modules
from providers.outbound import OutboundPolicy, default_ssl_context
from providers.router import ProviderRouter
from providers.transport import Transport


def new_transport() -> Transport:
    """A guarded transport with the deployment's timeouts (settings PROVIDER_*_TIMEOUT)."""
    return Transport(
        policy=OutboundPolicy.from_env(embedded=not settings.DISTRIBUTED),
        connect_timeout=settings.PROVIDER_CONNECT_TIMEOUT,
        read_timeout=settings.PROVIDER_READ_TIMEOUT,
    )


def warm_for_serving() -> None:
    """What a process's first turn would otherwise build on its event loop, built at
    start-up: the wire modules and the shared TLS context (the CA bundle's load is ~20 ms
    of CPU). A burst's first turns then start without holding every stream behind them."""
    preload_wire_modules()
    default_ssl_context()


def router_for_user(
    user_id: int,
    *,
    org_keys: bool = True,
    store: UserSecretStore | None = None,
    matrix: dict[str, CuratedModel] | None = None,
) -> ProviderRouter:
    """`org_keys=False` when the model policy lets only the user's own key serve the turn.
    `store` and `matrix`: the user's profiles and the curated matrix when the caller read
    them already (a burst of turn starts reads them once for all its users)."""
    return ProviderRouter(
        store if store is not None else UserSecretStore(user_id, org_keys=org_keys),
        # A snapshot taken here, in sync code: the engine asks for capabilities from its
        # event loop, where the ORM may not run. One router per turn, so an edit applies
        # to the next turn.
        matrix=matrix if matrix is not None else curated_matrix(),
        embedded=not settings.DISTRIBUTED,
        default_provider=settings.DEFAULT_PROVIDER,
        transport_factory=new_transport,
    )
