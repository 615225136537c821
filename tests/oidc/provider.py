"""Start a real OpenID Provider (panva/oidc-provider under Node.js) on loopback for tests.

`npm ci` installs it into tests/oidc/node_modules from the committed lockfile on first use.
Without Node.js the tests skip locally, and fail under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

HERE = Path(__file__).resolve().parent
STARTUP_SECONDS = 20


def node_or_skip() -> str:
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node and npm:
        return node
    reason = "Node.js/npm not installed: the SSO tests need them to run oidc-provider"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


def npm_ci() -> None:
    if (HERE / "node_modules" / "oidc-provider" / "package.json").exists():
        return
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=HERE, check=True, timeout=300
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rsa_jwk(kid: str) -> tuple[Any, dict[str, Any]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    # PyJWT marks a private JWK `key_ops: ["sign"]`; the OP also verifies with it (an
    # id_token_hint at sign-out), so let the key do both.
    jwk.pop("key_ops", None)
    jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
    return key, jwk


@dataclass
class OpenIDProvider:
    workdir: Path
    port: int
    client_id: str = "openworker"
    client_secret: str = field(default_factory=lambda: uuid.uuid4().hex)
    redirect_uris: tuple[str, ...] = ("http://testserver/sso/callback/",)
    post_logout_redirect_uris: tuple[str, ...] = ("http://testserver/accounts/login/",)
    process: subprocess.Popen | None = None
    signing_key: Any = None
    signing_jwk: dict[str, Any] = field(default_factory=dict)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def accounts_file(self) -> Path:
        return self.workdir / "accounts.json"

    def set_account(self, login: str, **claims: Any) -> None:
        accounts = json.loads(self.accounts_file.read_text()) if self.accounts_file.exists() else {}
        accounts[login] = claims
        self.accounts_file.write_text(json.dumps(accounts))

    def start(self) -> None:
        if self.signing_key is None:
            self.signing_key, self.signing_jwk = rsa_jwk("test-key-1")
        if not self.accounts_file.exists():
            self.accounts_file.write_text("{}")
        client = {
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "redirect_uris": list(self.redirect_uris),
            "post_logout_redirect_uris": list(self.post_logout_redirect_uris),
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
        }
        config = {
            "issuer": self.issuer,
            "port": self.port,
            "clients": [client],
            "signing_jwk": {k: v for k, v in self.signing_jwk.items()},
            "accounts_file": str(self.accounts_file),
        }
        config_path = self.workdir / "op.json"
        config_path.write_text(json.dumps(config))
        self.process = subprocess.Popen(
            ["node", str(HERE / "op.mjs"), str(config_path)],
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "op.log", "ab"),  # noqa: SIM115
            text=True,
        )
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            try:
                httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=1)
                return
            except httpx.HTTPError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"oidc-provider did not start: {(self.workdir / 'op.log').read_text()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def browser(self) -> httpx.Client:
        """A cookie-keeping client for the OP's own pages (one person's browser)."""
        return httpx.Client(base_url=self.issuer, follow_redirects=False, timeout=10)


FORM_ACTION = re.compile(r'<form[^>]*action="([^"]+)"')


def drive(
    op_browser: httpx.Client,
    authorize_url: str,
    *,
    login: str,
    consent: bool = True,
    until: str = "http://testserver/",
) -> str:
    """Follow the OP's redirects and answer its login and consent pages as a person would.

    Returns the first URL that leaves the OP for `until` (our callback, with code and state,
    or the error the OP sends back).
    """
    url = authorize_url
    for _ in range(20):
        if url.startswith(until):
            return url
        response = op_browser.get(url)
        if response.is_redirect:
            url = str(response.url.join(response.headers["location"]))
            continue
        html = response.text
        action = unescape(FORM_ACTION.search(html).group(1))
        target = str(response.url.join(action))
        if 'name="login"' in html:
            posted = op_browser.post(
                target, data={"prompt": "login", "login": login, "password": "any"}
            )
        elif not consent:
            abort = re.search(r'href="([^"]*abort[^"]*)"', html)
            posted = op_browser.get(str(response.url.join(unescape(abort.group(1)))))
        else:
            posted = op_browser.post(target, data={"prompt": "consent"})
        assert posted.is_redirect, posted.text[:500]
        url = str(posted.url.join(posted.headers["location"]))
    raise AssertionError("the OP never sent the browser back")
