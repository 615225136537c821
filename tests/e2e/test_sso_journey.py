"""A person signs in through the company's identity provider in headless Chromium.

The provider is a real OpenID Provider (oidc-provider under Node.js on loopback) with
its own login and consent pages; OpenWorker runs as the distributed stack (Daphne on
PostgreSQL and Redis). The person lands in their session list, where the model picker
offers their mapped team's curated models and not another team's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from providers.edge.models import MatrixModel
from sessions.sso.models import GroupMapping, IdentityProvider, SsoIdentity
from tests.oidc.provider import OpenIDProvider, free_port, node_or_skip, npm_ci

pytestmark = [pytest.mark.distributed, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def company_op(stack: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenIDProvider]:
    """The OP, with OpenWorker's real callback and sign-out URLs registered."""
    node_or_skip()
    npm_ci()
    op = OpenIDProvider(
        workdir=Path(tmp_path_factory.mktemp("company-op")),
        port=free_port(),
        redirect_uris=(f"{stack}/sso/callback/",),
        post_logout_redirect_uris=(f"{stack}/accounts/login/",),
    )
    op.start()
    yield op
    op.stop()


def test_sign_in_through_the_providers_page_lands_in_the_session_list_with_the_teams_models(
    stack, company_op, new_page, shot
):
    engineering = Group.objects.create(name="Engineering")
    ops = Group.objects.create(name="Ops")
    eng_model = MatrixModel.objects.create(
        model_id="anthropic:claude-eng", label="Claude for Engineering", provider="anthropic"
    )
    eng_model.groups.add(engineering)
    ops_model = MatrixModel.objects.create(
        model_id="anthropic:claude-ops", label="Claude for Ops", provider="anthropic"
    )
    ops_model.groups.add(ops)
    provider = IdentityProvider(
        slug="company", name="Company ID", issuer=company_op.issuer, client_id=company_op.client_id
    )
    provider.set_client_secret(company_op.client_secret)
    provider.save()
    GroupMapping.objects.create(provider=provider, claim_value="eng", group=engineering)
    GroupMapping.objects.create(provider=provider, claim_value="ops", group=ops)
    company_op.set_account(
        "nora", email="nora@company.test", email_verified=True, given_name="Nora", groups=["eng"]
    )

    page = new_page()
    page.goto(f"{stack}/accounts/login/")
    shot(page, "sign-in page with the provider button")
    page.get_by_role("link", name="Sign in with Company ID").click()
    page.wait_for_url(f"{company_op.issuer}/**")
    page.fill("input[name=login]", "nora")
    page.fill("input[name=password]", "anything")
    shot(page, "the provider's own login page")
    page.click("button[type=submit]")
    page.get_by_role("button", name="Continue").click()  # the provider's consent page
    page.wait_for_selector(".topbar .who")
    shot(page, "landed in the session list")

    assert page.url.rstrip("/") == stack
    assert page.get_by_role("heading", name="Your sessions").is_visible()
    options = page.locator("#new-model option").all_inner_texts()
    assert any("Claude for Engineering" in text for text in options)
    assert not any("Claude for Ops" in text for text in options)
    nora = get_user_model().objects.get(sso_identities__subject="nora")
    assert SsoIdentity.objects.get(user=nora).issuer == company_op.issuer
    assert list(nora.groups.values_list("name", flat=True)) == ["Engineering"]
