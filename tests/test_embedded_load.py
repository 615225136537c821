"""Embedded mode under a small team's load: 50 turns of 10 users started at once against
a real Daphne process on SQLite (`make run`'s configuration), while the same users load
pages and rename sessions (web requests write from threads of their own). No write may
be refused with "database is locked", and every stored reply must be the whole reply,
exactly what its socket streamed.

Not marked `distributed`: SQLite and the in-memory channel layer, no PostgreSQL or Redis.
The figures under heavier load are bench/stream_path.py's (`--mode embedded`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.fakes import AnthropicMessagesFake, Reply, Script, drip, text
from tests.support import embedded
from tests.support.chat import TERMINAL

USERS = 10
SESSIONS_PER_USER = 5
MODEL = "anthropic:claude-load"
# 40 tokens 20 ms apart: each turn streams for ~1 s, so all 50 overlap.
WORDS = [f"w{index} " for index in range(40)]
REPLY = "".join(WORDS)
# Page loads and renames per user while the turns stream.
WEB_ROUNDS = 3
TURN_TIMEOUT_SECONDS = 45.0

# Run in the server's environment: users, their provider profile pointing at the fake,
# sessions and signed-in cookies, printed as JSON.
SETUP = """
import json, os
from django.contrib.auth import get_user_model
from sessions.models import Session
from tests.support.chat import point_provider_at, session_cookie
users, per_user = int(os.environ["LOAD_USERS"]), int(os.environ["LOAD_SESSIONS"])
model, upstream = os.environ["LOAD_MODEL"], os.environ["LOAD_UPSTREAM"]
out = []
for index in range(users):
    user = get_user_model().objects.create_user(f"load-{index}", password=None)
    point_provider_at(user, "anthropic", upstream)
    cookie = session_cookie(user)
    sessions = [str(Session.objects.create(owner=user, model=model).pk) for _ in range(per_user)]
    out.append({"cookie": cookie, "sessions": sessions})
print(json.dumps(out))
"""


@dataclass
class Streamed:
    session: str
    turn: str = ""
    status: str = ""
    text: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def one_turn(base: str, cookie: str, session: str, go: asyncio.Event) -> Streamed:
    result = Streamed(session)
    try:
        await _stream(base, cookie, session, go, result)
    except (OSError, ConnectionClosed, TimeoutError) as exc:
        result.errors.append(repr(exc))  # reported with the server's output below
    return result


async def _stream(
    base: str, cookie: str, session: str, go: asyncio.Event, result: Streamed
) -> None:
    url = base.replace("http://", "ws://") + f"/ws/sessions/{session}/"
    async with connect(url, additional_headers={"Cookie": cookie, "Origin": base}) as ws:
        hello = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert hello["type"] == "hello", hello
        await go.wait()
        await ws.send(json.dumps({"type": "send", "text": "a reply, please"}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), TURN_TIMEOUT_SECONDS))
            if event.get("turn") and not result.turn:
                result.turn = event["turn"]
            if event.get("type") == "delta":
                result.text.append(event.get("text", ""))
            elif event.get("type") == "error":
                result.errors.append(event.get("error", ""))
                return
            elif event.get("type") == "turn.status" and event.get("status") in TERMINAL:
                result.status = event["status"]
                return


async def browse(base: str, cookie: str, sessions: list[str], go: asyncio.Event) -> list[int]:
    """A user's web requests during the turns: the session list, then a rename (a write
    from a request thread, racing the turns' writes)."""
    statuses = []
    name, _, value = cookie.partition("=")
    async with httpx.AsyncClient(
        base_url=base, headers={"Origin": base}, cookies={name: value}, timeout=30
    ) as client:
        await go.wait()
        for round_ in range(WEB_ROUNDS):
            statuses.append((await client.get("/")).status_code)
            form = await client.get(f"/sessions/{sessions[0]}/rename")
            statuses.append(form.status_code)
            token = client.cookies.get("csrftoken") or ""
            renamed = await client.post(
                f"/sessions/{sessions[0]}/rename",
                data={"title": f"renamed {round_}", "csrfmiddlewaretoken": token},
            )
            statuses.append(renamed.status_code)
            await asyncio.sleep(0.2)
    return statuses


async def drive(base: str, users: list[dict]) -> tuple[list[Streamed], list[int]]:
    go = asyncio.Event()
    turns = [
        asyncio.create_task(one_turn(base, user["cookie"], session, go))
        for user in users
        for session in user["sessions"]
    ]
    web = [asyncio.create_task(browse(base, u["cookie"], u["sessions"], go)) for u in users]
    await asyncio.sleep(1.0)  # every socket connected and waiting
    go.set()
    streamed = await asyncio.gather(*turns)
    statuses = [status for one in await asyncio.gather(*web) for status in one]
    return list(streamed), statuses


def test_fifty_concurrent_turns_of_ten_users_store_every_reply_without_a_lock_error(tmp_path):
    # Five replies at once per user: above the default cap of three, which a team that
    # works this way raises.
    env = embedded.embedded_env(
        tmp_path,
        OPENWORKER_AUTO_TITLE="0",
        MAX_CONCURRENT_TURNS_PER_USER=str(SESSIONS_PER_USER),
    )
    embedded.manage(env, "migrate", "--noinput")
    reply = Reply(drip(0.02), *[text(word) for word in WORDS])
    with AnthropicMessagesFake(script=Script(default=reply)) as fake:
        setup_env = dict(
            env,
            LOAD_USERS=str(USERS),
            LOAD_SESSIONS=str(SESSIONS_PER_USER),
            LOAD_MODEL=MODEL,
            LOAD_UPSTREAM=fake.base_url,
        )
        printed = embedded.manage(setup_env, "shell", "-c", SETUP)
        users = json.loads(printed.strip().splitlines()[-1])
        with embedded.daphne(env) as (base, proc):
            streamed, web_statuses = asyncio.run(drive(base, users))
            output = proc.output()

    assert embedded.lock_errors(output) == 0, output[-4000:]
    assert embedded.journal_mode(tmp_path / "db.sqlite3") == "wal"
    assert Counter(s.status for s in streamed) == {"completed": USERS * SESSIONS_PER_USER}, [
        (s.status, s.errors) for s in streamed if s.status != "completed"
    ]
    assert set(web_statuses) <= {200, 302}, Counter(web_statuses)
    stored = embedded.stored_turns(tmp_path / "db.sqlite3", [s.turn for s in streamed])
    assert len(stored) == USERS * SESSIONS_PER_USER
    for one in streamed:
        status, text_in_db = stored[one.turn]
        assert status == "completed", (one.session, status)
        assert "".join(one.text) == REPLY, one.session
        assert text_in_db == REPLY, (one.session, text_in_db[-80:])
