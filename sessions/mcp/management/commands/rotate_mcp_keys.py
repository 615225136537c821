"""Re-encrypt every MCP server's stored bearer token and headers under the newest key.

The same drill as `rotate_keys` (provider keys): new key first in
OPENWORKER_ENCRYPTION_KEYS, restart, run both commands, remove the old key. Each row is
rotated under a row lock; one no key can decrypt is reported and left as it is.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Q

from providers.edge import crypto
from sessions.mcp.models import McpServer

SECRET_FIELDS = ("bearer_encrypted", "headers_encrypted")


class Command(BaseCommand):
    help = "Re-encrypt every MCP server's stored secrets under the newest encryption key."

    def handle(self, *args: object, **options: object) -> None:
        ids = list(
            McpServer.objects.filter(
                ~Q(bearer_encrypted="") | ~Q(headers_encrypted="")
            ).values_list("pk", flat=True)
        )
        rotated, failed = 0, []
        for pk in ids:
            with transaction.atomic():
                server = McpServer.objects.select_for_update().filter(pk=pk).first()
                if server is None:
                    continue
                try:
                    fresh = {
                        name: crypto.rotate(getattr(server, name))
                        for name in SECRET_FIELDS
                        if getattr(server, name)
                    }
                except crypto.DecryptionError:
                    failed.append(pk)
                    continue
                McpServer.objects.filter(pk=pk).update(**fresh)
                rotated += 1
        self.stdout.write(f"Rotated the secrets of {rotated} MCP server(s).")
        if failed:
            raise CommandError(
                f"{len(failed)} MCP server(s) could not be decrypted with any key of the ring "
                f"(ids {', '.join(map(str, failed))}); they were left unchanged."
            )
