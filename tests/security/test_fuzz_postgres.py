"""Property-based fuzzing against PostgreSQL (distributed phase): every form and the import
endpoint through the full Django stack (the in-process test client; no live server).

PostgreSQL is where bad text used to turn into 500s (a NUL byte is refused by the
database itself, a 10,000-character id overflows a varchar), so this suite runs there.
Hypothesis draws at least `EXAMPLES` inputs per entry point (collected first, then replayed
through one client so the run stays bounded); the property: no request answers 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import strategies as st

from sessions.models import Session
from tests.security.figures import record
from tests.security.test_fuzz import EXAMPLES, collect, json_values

# 1,000 requests per entry point: above the suite's default per-test timeout on a loaded
# machine (about a minute each here; the admin's add form is the slowest).
pytestmark = [pytest.mark.distributed, pytest.mark.django_db, pytest.mark.timeout(600)]
# Imports that are then opened and exported (each costs five requests): enough to cover
# every shape the generator finds, few enough to keep the suite's run time in minutes.
OPENED_IMPORTS = 150

# What people (and attackers) type: any text, the awkward classics, oversize values.
hostile = st.sampled_from(
    ["", " ", "\x00", "a\x00b", "0", "-1", "null", "%00", "'; drop table x; --", "../../etc"]
)
field_values = st.one_of(
    st.text(max_size=300),
    hostile,
    st.integers().map(str),
    st.integers(min_value=190, max_value=12_000).map(lambda n: "m" * n),
    st.text(min_size=1, max_size=5).map(lambda t: t + "\x00" + t),
)
FORMS: dict[str, list[str]] = {
    "/?q={v}&page={w}": [],
    "/sessions/new": ["model", "custom_model", "title"],
    "/sessions/{sid}/rename": ["title", "next"],
    "/sessions/{sid}/model": ["model", "custom_model"],
    "/sessions/{sid}/archive": ["archived", "next"],
    "/sessions/{sid}/messages?after={v}&before={w}": [],
    "/settings/default-model": ["model", "custom_model"],
    "/settings/providers/groq/": ["api_key", "base_url", "region", "clear_key"],
    "/settings/providers/groq/test": ["model"],
    "/accounts/login/": ["username", "password"],
    "/accounts/password_change/": ["old_password", "new_password1", "new_password2"],
    "/admin/chat_sessions/session/?q={v}&o={w}": [],
    "/admin/providers/matrixmodel/add/": ["model_id", "label", "provider", "context_window"],
    "/admin/providers/teammodelpolicy/add/": ["team", "custom_models"],
}


def form_strategy(fields: list[str]) -> st.SearchStrategy[Any]:
    extra = st.dictionaries(st.text(min_size=1, max_size=10), field_values, max_size=3)
    named = st.fixed_dictionaries({}, optional={f: field_values for f in fields})
    return st.tuples(named, extra, field_values, field_values)


@pytest.mark.parametrize("path", list(FORMS))
def test_generated_form_inputs_never_answer_5xx_on_postgres(
    owner: Any, path: str, settings: Any, monkeypatch: pytest.MonkeyPatch, require_distributed
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_ENABLED = False  # the throttle answers 429 and would hide the form
    monkeypatch.setattr("openworker.runtime.turns.runner.turn_enqueue", lambda turn_id: None)
    monkeypatch.setattr("providers.edge.views.connection_test", lambda **kw: "no", raising=False)
    owner.is_staff = owner.is_superuser = True  # the admin's forms are forms too
    owner.save()
    session = Session.objects.create(owner=owner, model="groq:llama")
    client = Client(raise_request_exception=False)
    if "login" not in path:
        client.force_login(owner)
    inputs = collect(form_strategy(FORMS[path]))
    assert len(inputs) >= EXAMPLES
    for named, extra, v, w in inputs:
        url = path.format(sid=session.pk, v=_query(v), w=_query(w))
        response = client.post(url, {**extra, **named}) if FORMS[path] else client.get(url, extra)
        assert response.status_code < 500, (url, named, extra, response.status_code)
    record(
        "fuzz.postgres_http_inputs",
        len(inputs),
        "generated form/query inputs against PostgreSQL: 0 answers 5xx",
    )


def _query(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


# --- the import endpoint -------------------------------------------------------------------

# Text with anything in it, lone surrogates included (json.dumps writes them as \udXXX).
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60)
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "file", "other"]) | json_values},
    optional={
        "text": any_text | json_values,
        "attachment": st.fixed_dictionaries({}, optional={"id": any_text, "name": any_text})
        | json_values,
        "image_url": json_values,
    },
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "hacker"]) | json_values},
    optional={
        "seq": st.integers(min_value=-2, max_value=50) | st.none() | json_values,
        "content": any_text | st.lists(part, max_size=3) | json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": any_text | json_values},
                optional={"name": any_text, "arguments": json_values},
            ),
            max_size=2,
        )
        | json_values,
        "tool_call_id": any_text | st.integers(min_value=150, max_value=10_000).map("t".__mul__),
        "model": any_text | st.integers(min_value=150, max_value=10_000).map("m".__mul__),
        "reasoning": any_text | json_values,
        "extras": json_values,
        "usage": st.dictionaries(st.sampled_from(["input", "output"]), json_values, max_size=2),
        "finish_reason": any_text,
    },
)
attachment = st.fixed_dictionaries(
    {
        "id": st.uuids().map(str) | any_text,
        "data": st.sampled_from(["", "@@", "aGk=", "iVBORw0KGgo="]),
    },
    optional={"size": st.integers(), "sha256": any_text, "name": any_text},
)
documents = st.fixed_dictionaries(
    {
        "format": st.just("openworker.session") | any_text,
        "version": st.just(1) | json_values,
        "messages": st.lists(message, max_size=5) | json_values,
    },
    optional={
        "session": st.fixed_dictionaries({}, optional={"title": any_text, "model": any_text})
        | json_values,
        "attachments": st.lists(attachment, max_size=2) | json_values,
    },
)
import_files = st.one_of(
    documents.map(lambda d: json.dumps(d).encode()),
    documents.map(lambda d: json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.integers(min_value=1, max_value=20_000).map(lambda n: b"[" * n + b"]" * n),
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
)


def test_generated_import_files_never_answer_5xx_on_postgres(
    owner: Any, settings: Any, tmp_path: Any, require_distributed
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.MEDIA_ROOT = tmp_path
    client = Client(raise_request_exception=False)
    client.force_login(owner)
    files = collect(import_files)
    assert len(files) >= EXAMPLES
    imported = 0
    for data in files:
        upload = SimpleUploadedFile("x.json", data, content_type="application/json")
        response = client.post("/sessions/import", {"file": upload})
        assert response.status_code in (302, 400), (data[:300], response.status_code)
        if response.status_code == 302:
            imported += 1
            if imported > OPENED_IMPORTS:
                continue
            # What was imported opens: the chat page and every export answer.
            chat = response["Location"]
            for url in (chat, f"{chat}export.json", f"{chat}export.md", f"{chat}messages?after=0"):
                got = client.get(url)
                assert got.status_code == 200, (url, data[:300])
                if got.streaming:
                    b"".join(got.streaming_content)
    assert b"".join(client.get("/sessions/export.zip").streaming_content)
    record(
        "fuzz.postgres_import_files",
        len(files),
        "generated import files against PostgreSQL: 0 answers 5xx (the first "
        f"{OPENED_IMPORTS} imported each opened and exported)",
    )
