"""Re-encrypt every stored provider key under the newest key of the ring.

The drill: put a new key FIRST in OPENWORKER_ENCRYPTION_KEYS (keep the old one after
it), restart, run `python manage.py rotate_keys`, then remove the old key. Every row is
rotated in its own short transaction under a row lock, so a concurrent save is never
overwritten with stale ciphertext; a row that no key of the ring can decrypt is reported
and left alone (and the command exits non-zero) rather than lost.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from providers.edge import crypto
from providers.edge.models import ProviderProfile


class Command(BaseCommand):
    help = "Re-encrypt every stored provider key under the newest encryption key."

    def handle(self, *args: object, **options: object) -> None:
        ids = list(
            ProviderProfile.objects.exclude(api_key_encrypted="").values_list("pk", flat=True)
        )
        rotated, failed = 0, []
        for pk in ids:
            with transaction.atomic():
                profile = ProviderProfile.objects.select_for_update().filter(pk=pk).first()
                if profile is None or not profile.api_key_encrypted:
                    continue
                try:
                    token = crypto.rotate(profile.api_key_encrypted)
                except crypto.DecryptionError:
                    failed.append(pk)
                    continue
                ProviderProfile.objects.filter(pk=pk).update(api_key_encrypted=token)
                rotated += 1
        self.stdout.write(f"Rotated {rotated} key(s) to the newest encryption key.")
        if failed:
            raise CommandError(
                f"{len(failed)} profile(s) could not be decrypted with any key of the ring "
                f"(ids {', '.join(map(str, failed))}); they were left unchanged."
            )
