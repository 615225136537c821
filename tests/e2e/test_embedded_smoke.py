"""Embedded mode from a clean checkout: `make run` serves a page where the first admin
signs in, saves an Anthropic key and base URL (the fake) and sees one reply stream.

Not marked `distributed`: it needs no PostgreSQL or Redis (SQLite and the in-memory
channel layer under `.state/` of the copy), so it runs in the first phase of `make test`.
The copy is the working tree's files that a commit would hold (tracked plus untracked,
minus git-ignored: no `.venv`, `.state` or artifacts), which equals a clone of HEAD in CI.
The current virtualenv is reused (`VENV=`, its install stamp held old with `make -o`) so
nothing is installed and the editable install is never repointed at the copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.pages import (
    API_KEY,
    AXE,
    LIVE_TIMEOUT_MS,
    RUN_AXE,
    assistant_with,
    save_anthropic_settings,
    send,
    sign_in,
    wait_connected,
    wait_streamed,
)
from tests.fakes import AnthropicMessagesFake, Reply, drip, text
from tests.support.procs import free_port

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
ADMIN_PASSWORD = "embedded-admin-pass-123"
MODEL = "anthropic:claude-e2e"
# `make run` migrates a fresh SQLite database before serving: allow for a slow machine.
START_TIMEOUT_SECONDS = 90.0
# Settings a distributed run exports that would turn the copy into something else.
NOT_FOR_EMBEDDED = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "OPENWORKER_ENCRYPTION_KEYS",
    "OPENWORKER_OUTBOUND_ALLOWLIST",
    "DEBUG",
    "ALLOWED_HOSTS",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
)


def copy_checkout(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree
            continue
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    return target


def embedded_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_EMBEDDED}
    env.update(
        OPENWORKER_ADMIN_PASSWORD=ADMIN_PASSWORD,
        # A title request would take the fake's scripted reply before the turn does.
        OPENWORKER_AUTO_TITLE="0",
        PYTHONUNBUFFERED="1",
    )
    return env


@contextlib.contextmanager
def make_run(checkout: Path, log: Path) -> Iterator[str]:
    """`make run` in `checkout` on a free port; yields its URL once sign-in answers, and
    kills its whole process group (make, Daphne) afterwards."""
    port = free_port()
    stamp = VENV / ".installed-run"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "run", f"VENV={VENV}", "-o", str(stamp), f"PORT={port}"],
            cwd=checkout,
            env=embedded_env(port),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"make run exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/accounts/login/", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"make run did not serve the sign-in page:\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
        yield base
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
                break


def test_make_run_from_a_clean_checkout_signs_in_and_streams_a_reply(tmp_path, new_page, shot):
    checkout = copy_checkout(tmp_path / "checkout")
    assert not (checkout / ".state").exists()
    log = tmp_path / "make-run.log"
    with AnthropicMessagesFake(api_key=API_KEY) as fake, make_run(checkout, log) as base:
        assert "Created the first admin account." in log.read_text()
        assert (checkout / ".state").is_dir(), "embedded mode keeps its state in the checkout"

        page = new_page()
        sign_in(page, base, "admin", ADMIN_PASSWORD)
        shot(page, "admin signed in")

        save_anthropic_settings(page, base, api_key=API_KEY, upstream=fake.base_url)
        assert "Your key (…WXYZ)" in page.inner_text("main")
        assert API_KEY not in page.content()
        shot(page, "key saved")

        page.goto(f"{base}/")
        page.select_option("#new-model", "__custom__")
        page.fill("#new-custom", MODEL)
        page.click("button:has-text('Start a session')")
        wait_connected(page)
        words = [f"tok{i} " for i in range(30)]
        fake.push(Reply(drip(0.05), *[text(w) for w in words]))
        send(page, "Hello from the embedded smoke test.")
        wait_streamed(page, "tok2 ")
        assert "tok29" not in page.inner_text("[data-live]")
        shot(page, "reply streaming")
        assistant_with(page, "tok29")
        page.wait_for_function(
            "() => !document.querySelector('[data-live] .streaming')", timeout=LIVE_TIMEOUT_MS
        )
        assert page.inner_text("#transcript").count("tok29") == 1
        shot(page, "reply complete")
        assert fake.requests[-1].headers.get("x-api-key") == API_KEY

        # DEBUG is off in `make run`: a missing page is the styled 404 (no URL list, no
        # traceback) and the stylesheet is still served (whitenoise, no collectstatic).
        missing = httpx.get(f"{base}/no-such-page/", timeout=5)
        assert missing.status_code == 404
        assert "There is nothing here" in missing.text
        assert "URLconf" not in missing.text and "Traceback" not in missing.text
        css = httpx.get(f"{base}/static/css/app.css", timeout=5)
        assert css.status_code == 200 and "--fg" in css.text

        # The styled error page as a browser shows it, in both themes: readable (axe's
        # contrast rules included) and styled by the app's stylesheet.
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            page.goto(f"{base}/no-such-page/")
            assert "There is nothing here" in page.inner_text("main")
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == {"light": "rgb(246, 247, 249)", "dark": "rgb(20, 23, 29)"}[scheme]
            page.add_script_tag(url=AXE)
            assert page.evaluate(RUN_AXE) == [], scheme
            shot(page, f"styled 404 {scheme}")
