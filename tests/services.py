"""`python -m tests.services DATABASE_URL REDIS_URL`: exit 0 when both answer.

Creates the PostgreSQL database if the server is up but the database is missing, so a
fresh machine needs no manual `createdb`.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

import psycopg
import redis


def postgres_ready(url: str) -> bool:
    parts = urlsplit(url)
    dbname = parts.path.lstrip("/") or "postgres"
    admin_url = parts._replace(path="/postgres").geturl()
    try:
        with psycopg.connect(admin_url, connect_timeout=3, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [dbname]
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{dbname}"')
    except psycopg.Error as exc:
        print(f"PostgreSQL not reachable at {parts.hostname}:{parts.port}: {exc}", file=sys.stderr)
        return False
    return True


def redis_ready(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        print(f"Redis not reachable: {exc}", file=sys.stderr)
        return False
    return True


def main(argv: list[str]) -> int:
    database_url, redis_url = argv
    ok = postgres_ready(database_url)
    ok = redis_ready(redis_url) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
