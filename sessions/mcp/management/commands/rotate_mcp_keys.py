"""Re-encrypt every stored MCP secret under the newest key: servers' bearer tokens,
headers and OAuth client credentials, and users' OAuth tokens (`McpConnection`).

The same drill as `rotate_keys` (provider keys): new key first in
OPENWORKER_ENCRYPTION_KEYS, restart, run both commands, remove the old key. Each row is
rotated under a row lock; one no key can decrypt is reported and left as it is.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import models, transaction
from django.db.models import Q

from providers.edge import crypto
from sessions.mcp.models import McpConnection, McpServer

SECRET_FIELDS: dict[type[models.Model], tuple[str, ...]] = {
    McpServer: (
        "bearer_encrypted",
        "headers_encrypted",
        "oauth_client_secret_encrypted",
        "oauth_client_encrypted",
    ),
    McpConnection: ("access_encrypted", "refresh_encrypted"),
}


def _rotate(model: type[models.Model], fields: tuple[str, ...]) -> tuple[int, list[int]]:
    holding = Q()
    for name in fields:
        holding |= ~Q(**{name: ""})
    ids = list(model.objects.filter(holding).values_list("pk", flat=True))  # type: ignore[attr-defined]
    rotated, failed = 0, []
    for pk in ids:
        with transaction.atomic():
            row = model.objects.select_for_update().filter(pk=pk).first()  # type: ignore[attr-defined]
            if row is None:
                continue
            try:
                fresh = {
                    name: crypto.rotate(getattr(row, name)) for name in fields if getattr(row, name)
                }
            except crypto.DecryptionError:
                failed.append(pk)
                continue
            model.objects.filter(pk=pk).update(**fresh)  # type: ignore[attr-defined]
            rotated += 1
    return rotated, failed


class Command(BaseCommand):
    help = "Re-encrypt every stored MCP secret under the newest encryption key."

    def handle(self, *args: object, **options: object) -> None:
        servers, bad_servers = _rotate(McpServer, SECRET_FIELDS[McpServer])
        connections, bad_connections = _rotate(McpConnection, SECRET_FIELDS[McpConnection])
        self.stdout.write(f"Rotated the secrets of {servers} MCP server(s).")
        self.stdout.write(f"Rotated the tokens of {connections} MCP connection(s).")
        problems = []
        if bad_servers:
            problems.append(
                f"{len(bad_servers)} MCP server(s) (ids {', '.join(map(str, bad_servers))})"
            )
        if bad_connections:
            problems.append(
                f"{len(bad_connections)} MCP connection(s) "
                f"(ids {', '.join(map(str, bad_connections))})"
            )
        if problems:
            raise CommandError(
                f"{' and '.join(problems)} could not be decrypted with any key of the ring; "
                "they were left unchanged."
            )
