"""The user's provider settings: their own profiles (key write-only, base URL, region),
"test connection", delete, and their default model.

Which profile applies is the SecretStore's rule (providers.edge.secret_store): the user's own
profile when they have one (used whole, never mixed with the organisation's), else the
organisation's. The page says which, so nobody wonders whose key a turn runs on.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from openworker.runtime.agent.llm import router_for_user
from providers.capabilities import split_model
from providers.edge.forms import ConnectionTestForm, ProviderProfileForm
from providers.edge.model_policy import model_decide
from providers.edge.models import ProviderProfile
from providers.errors import ProviderError
from providers.registry import ProviderDescriptor, get_descriptor, provider_names
from sessions import presenters, selectors, services

logger = logging.getLogger(__name__)

# The connection test asks for almost nothing: it proves key, endpoint and model work.
TEST_PROMPT = "Reply with the single word OK."
TEST_MAX_TOKENS = 16


def _descriptor(provider: str) -> ProviderDescriptor:
    descriptor = get_descriptor(provider)
    if descriptor is None:
        raise Http404("No such provider.")
    return descriptor


def _default_provider() -> str:
    return settings.DEFAULT_PROVIDER


def _applies(own: ProviderProfile | None, org: ProviderProfile | None) -> str:
    """Which profile a turn uses: "user", "user_without_key", "organisation" or "none"."""
    if own is not None:
        return "user" if own.has_key else "user_without_key"
    if org is not None:
        return "organisation"
    return "none"


def _suggested_test_model(user: Any, provider: str) -> str:
    """A model of `provider` to test with: the user's default if it is one, else the first
    curated model of the provider, else nothing (the user types one)."""
    default = selectors.user_default_model(user=user)
    if split_model(default, default_provider=_default_provider())[0] == provider:
        return default
    for entry in selectors.model_choices(user=user):
        if split_model(entry.id, default_provider=_default_provider())[0] == provider:
            return entry.id
    return ""


@login_required
def settings_page(request: HttpRequest) -> HttpResponse:
    own = {p.provider: p for p in ProviderProfile.objects.filter(owner=request.user)}
    org = {p.provider: p for p in ProviderProfile.objects.filter(owner__isnull=True)}
    rows = []
    for name in provider_names():
        descriptor = get_descriptor(name)
        assert descriptor is not None
        rows.append(
            {
                "name": name,
                "label": descriptor.label or name,
                "own": own.get(name),
                "org": org.get(name) is not None,
                "applies": _applies(own.get(name), org.get(name)),
                "test_model": _suggested_test_model(request.user, name),
                "requires_key": descriptor.requires_key,
            }
        )
    default_model = selectors.user_default_model(user=request.user)
    return render(
        request,
        "providers/settings.html",
        {"rows": rows, "picker": presenters.model_picker(request.user, default_model)},
    )


@login_required
@require_http_methods(["GET", "POST"])
def profile_edit(request: HttpRequest, provider: str) -> HttpResponse:
    descriptor = _descriptor(provider)
    profile = ProviderProfile.objects.filter(owner=request.user, provider=provider).first()
    if request.method == "POST":
        form = ProviderProfileForm(request.POST, descriptor=descriptor)
        if form.is_valid():
            form.save(profile or ProviderProfile(owner=request.user, provider=provider))
            messages.success(request, f"{descriptor.label or provider} settings saved.")
            return redirect("provider_settings")
    else:
        initial = {"base_url": profile.base_url, "region": profile.region} if profile else {}
        form = ProviderProfileForm(initial=initial, descriptor=descriptor)
    org = ProviderProfile.objects.filter(owner__isnull=True, provider=provider).exists()
    return render(
        request,
        "providers/edit.html",
        {"form": form, "descriptor": descriptor, "profile": profile, "org": org},
    )


@login_required
@require_POST
def profile_test(request: HttpRequest, provider: str) -> HttpResponse:
    descriptor = _descriptor(provider)
    form = ConnectionTestForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Name a model to test the connection with.")
        return redirect("provider_settings")
    model = form.cleaned_data["model"].strip()
    if split_model(model, default_provider=_default_provider())[0] != provider:
        model = f"{provider}:{model}"
    label = descriptor.label or provider
    # A test call is a model call: the same model policy as a turn.
    decision = model_decide(user=request.user, model=model)
    if not decision.allowed:
        messages.error(request, f"{label}: {decision.reason}")
        return redirect("provider_settings")
    error = connection_test(user_id=request.user.pk, model=model, org_keys=decision.org_keys)
    if error is None:
        messages.success(request, f"{label}: the connection works ({model} answered).")
    else:
        messages.error(request, f"{label}: {error}")
    return redirect("provider_settings")


def connection_test(
    *, user_id: int, model: str, router: Any = None, org_keys: bool = True
) -> str | None:
    """None when `model` answers a tiny request through the user's router, else the
    friendly reason (never the upstream body: it may echo the request). `org_keys`: the
    model policy's word on whether the organisation's keys may serve `model`."""
    if router is None:
        router = router_for_user(user_id, org_keys=org_keys)
    try:
        router.complete(
            model=model,
            messages=[{"role": "user", "content": TEST_PROMPT}],
            max_tokens=TEST_MAX_TOKENS,
        )
    except ProviderError as exc:
        return exc.friendly
    except Exception as exc:
        logger.info("connection test failed: %s", type(exc).__name__)
        return "The provider could not be reached with these settings."
    finally:
        router.close()
    return None


@login_required
@require_http_methods(["GET", "POST"])
def profile_delete(request: HttpRequest, provider: str) -> HttpResponse:
    descriptor = _descriptor(provider)
    profile = ProviderProfile.objects.filter(owner=request.user, provider=provider).first()
    if profile is None:
        raise Http404("No such profile.")
    if request.method == "POST":
        profile.delete()
        messages.success(request, f"Your {descriptor.label or provider} settings were deleted.")
        return redirect("provider_settings")
    return render(request, "providers/delete.html", {"descriptor": descriptor})


@login_required
@require_POST
def default_model(request: HttpRequest) -> HttpResponse:
    model = presenters.chosen_model(request.POST)
    if len(model) > 200:
        messages.error(request, "That model name is too long.")
    else:
        try:
            model = services.user_set_default_model(user=request.user, model=model)
        except services.TurnRefused as exc:
            messages.error(request, str(exc))
            return redirect("provider_settings")
        messages.success(
            request, f"New sessions start with {model}." if model else "Default model reset."
        )
    return redirect("provider_settings")
