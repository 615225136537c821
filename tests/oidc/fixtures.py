"""pytest fixtures: a real OpenID Provider per module and its row in our database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.cache import cache

from sessions.sso.models import IdentityProvider
from tests.oidc.provider import OpenIDProvider, free_port, node_or_skip, npm_ci


@pytest.fixture(scope="module")
def oidc_op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenIDProvider]:
    node_or_skip()
    npm_ci()
    op = OpenIDProvider(workdir=Path(tmp_path_factory.mktemp("oidc-op")), port=free_port())
    op.start()
    yield op
    op.stop()


@pytest.fixture
def idp(db, oidc_op: OpenIDProvider, settings):  # type: ignore[no-untyped-def]
    """The admin's configuration for the running OP (secret stored encrypted)."""
    cache.clear()  # discovery is cached per issuer; each test starts from the OP itself
    provider = IdentityProvider(
        slug="corp", name="Corp ID", issuer=oidc_op.issuer, client_id=oidc_op.client_id
    )
    provider.set_client_secret(oidc_op.client_secret)
    provider.save()
    if not (oidc_op.process and oidc_op.process.poll() is None):
        oidc_op.start()
    return provider
