"""End-to-end fixtures: headless Debian Chromium driven by Playwright against the
distributed stack (Daphne, a Celery worker, Redis, PostgreSQL) and fake upstreams.

Every step can be photographed with `shot(page, "name")` into artifacts/e2e/<test>/
(git-ignored); a failing test saves the screenshot and HTML of every open page.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from providers.edge.models import MatrixModel
from sessions.models import Session
from tests.e2e.pages import (
    ALICE_PASSWORD,
    API_KEY,
    BOB_PASSWORD,
    MODEL,
    ROOT_PASSWORD,
    sign_in,
    wait_connected,
)
from tests.fakes import AnthropicMessagesFake
from tests.support import procs
from tests.support.chat import point_provider_at

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "e2e"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Django's switch for ORM calls while an event loop runs on the thread (see `browser`).
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "_", text)[:120]


@contextlib.contextmanager
def _env_without(name: str) -> Iterator[None]:
    """Drop `name` from os.environ for a moment (child processes spawned now lack it)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Chromium for one test module.

    Playwright's sync API keeps an asyncio loop running on the main thread, where Django
    would then refuse every ORM call of the test ("async context"). The calls are not
    concurrent (Playwright switches greenlets, it does not run them alongside), so the
    check is switched off in this process while the browser lives: per module, so no other
    test runs with it, and never for the Daphne/Celery processes (see `daphne_server`).
    """
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        message = "chromium is not installed (apt-get install chromium; .ci/run does it)"
        # CI must prove the journeys; a newcomer's `make test` without a browser says why
        # it skipped them instead of failing.
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    saved = os.environ.get(ASYNC_UNSAFE)
    os.environ[ASYNC_UNSAFE] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if saved is None:
            os.environ.pop(ASYNC_UNSAFE, None)
        else:
            os.environ[ASYNC_UNSAFE] = saved


@pytest.fixture(scope="module")
def daphne_server(distributed_env: dict[str, str]) -> Iterator[str]:
    """tests/conftest.py's Daphne, started without the browser's ASYNC_UNSAFE switch."""
    with _env_without(ASYNC_UNSAFE):
        server = procs.daphne(distributed_env)
        base_url = server.__enter__()
    try:
        yield base_url
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def celery_worker(distributed_env: dict[str, str]) -> Iterator[procs.Proc]:
    """tests/conftest.py's Celery worker, started without the ASYNC_UNSAFE switch."""
    with _env_without(ASYNC_UNSAFE):
        worker = procs.celery_worker(distributed_env)
        proc = worker.__enter__()
    try:
        yield proc
    finally:
        worker.__exit__(None, None, None)


class Shots:
    """Numbered screenshots of one test's steps; a parametrized test's combination (for
    example `phone-dark`) ends every file name, so shots of one step sort side by side."""

    def __init__(self, folder: Path, tag: str = "") -> None:
        self.folder = folder
        self.tag = tag
        self.count = 0
        self.pages: list[object] = []
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, page: object, name: str) -> Path:
        self.count += 1
        suffix = f"-{self.tag}" if self.tag and self.tag not in name else ""
        path = self.folder / f"{self.count:02d}-{_slug(name + suffix)}.png"
        page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        return path

    def capture_failure(self) -> None:
        for index, page in enumerate(self.pages):
            try:
                page.screenshot(path=str(self.folder / f"FAILED-{index}.png"), full_page=True)  # type: ignore[attr-defined]
                (self.folder / f"FAILED-{index}.html").write_text(page.content())  # type: ignore[attr-defined]
            except Exception:  # noqa: S112 - a closed page has nothing to save
                continue


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Shots:
    callspec = getattr(request.node, "callspec", None)
    return Shots(ARTIFACTS / _slug(request.node.name), callspec.id if callspec else "")


@pytest.fixture
def new_page(browser: object, shot: Shots, request: pytest.FixtureRequest) -> Iterator[object]:
    """`new_page()` opens a page in a fresh browser context (its own cookies). When the
    test fails, every page's screenshot and HTML are saved before the contexts close."""
    contexts: list[object] = []

    def make() -> object:
        context = browser.new_context(
            viewport={"width": 1280, "height": 900}, accept_downloads=True
        )  # type: ignore[attr-defined]
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        shot.pages.append(page)
        return page

    yield make
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        shot.capture_failure()
    for context in contexts:
        context.close()  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


# --- journeys' shared fixtures ---------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(daphne_server: str, celery_worker: object) -> str:
    """The distributed stack (Daphne + a Celery worker on PostgreSQL and Redis): its URL."""
    return daphne_server


@pytest.fixture
def fake() -> Iterator[AnthropicMessagesFake]:
    """The Anthropic fake, expecting the journeys' distinctive key."""
    with AnthropicMessagesFake(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def curated_model(db: object) -> MatrixModel:
    """A curated model on the fake's provider (the admin matrix, written through the ORM)."""
    return MatrixModel.objects.create(
        model_id=MODEL,
        label="Claude E2E",
        provider="anthropic",
        tools=True,
        vision=True,
        pdf=True,
        context_window=200_000,
        max_output_tokens=8_192,
    )


@pytest.fixture
def alice(db: object) -> object:
    return get_user_model().objects.create_user("alice", password=ALICE_PASSWORD)


@pytest.fixture
def bob(db: object) -> object:
    return get_user_model().objects.create_user("bob", password=BOB_PASSWORD)


@pytest.fixture
def root(db: object) -> object:
    return get_user_model().objects.create_superuser("root", password=ROOT_PASSWORD)


@pytest.fixture
def alice_chat(
    stack: str, new_page: object, alice: object, curated_model: object, fake: object
) -> object:
    """Alice signed in (her key set up already) on the page of a new curated session;
    the session is `page.session`."""
    point_provider_at(alice, "anthropic", fake.base_url, api_key=API_KEY)  # type: ignore[attr-defined]
    session = Session.objects.create(owner=alice, model=MODEL, title="E2E session")
    page = new_page()  # type: ignore[operator]
    sign_in(page, stack, "alice", ALICE_PASSWORD)
    page.goto(f"{stack}/sessions/{session.pk}/")  # type: ignore[attr-defined]
    wait_connected(page)
    page.session = session  # type: ignore[attr-defined]
    return page


class Site:
    """A tiny web site on 127.0.0.1 for `fetch_url` to read (path → HTML); records hits."""

    def __init__(self, pages: dict[str, str]) -> None:
        site = self
        self.pages = pages
        self.hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.hits.append(self.path)
                body = site.pages.get(self.path)
                payload = (body if body is not None else "not found").encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_site() -> Iterator[Site]:
    site = Site({})
    yield site
    site.close()
