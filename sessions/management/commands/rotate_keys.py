"""Re-encrypt every stored secret under the newest key of the ring.

The drill: put a new key FIRST in OPENWORKER_ENCRYPTION_KEYS (keep the old one after
it), restart, run `python manage.py rotate_keys`, then remove the old key. Every row is
rotated in its own short transaction under a row lock, so a concurrent save is never
overwritten with stale ciphertext; a row that no key of the ring can decrypt is reported
and left alone (and the command exits non-zero) rather than lost.

Rotated: provider API keys and identity providers' client secrets (single sign-on).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import models, transaction

from providers.edge import crypto
from providers.edge.models import ProviderProfile
from sessions.sso.models import IdentityProvider

# (model, the field holding key-ring ciphertext)
ENCRYPTED_FIELDS: tuple[tuple[type[models.Model], str], ...] = (
    (ProviderProfile, "api_key_encrypted"),
    (IdentityProvider, "client_secret_encrypted"),
)


class Command(BaseCommand):
    help = "Re-encrypt every stored provider key and SSO client secret under the newest key."

    def handle(self, *args: object, **options: object) -> None:
        rotated, failed = 0, []
        for model, field in ENCRYPTED_FIELDS:
            ids = list(model.objects.exclude(**{field: ""}).values_list("pk", flat=True))
            for pk in ids:
                with transaction.atomic():
                    row = model.objects.select_for_update().filter(pk=pk).first()
                    if row is None or not getattr(row, field):
                        continue
                    try:
                        token = crypto.rotate(getattr(row, field))
                    except crypto.DecryptionError:
                        failed.append(f"{model._meta.model_name} {pk}")
                        continue
                    model.objects.filter(pk=pk).update(**{field: token})
                    rotated += 1
        self.stdout.write(f"Rotated {rotated} key(s) to the newest encryption key.")
        if failed:
            raise CommandError(
                f"{len(failed)} secret(s) could not be decrypted with any key of the ring "
                f"({', '.join(failed)}); they were left unchanged."
            )
