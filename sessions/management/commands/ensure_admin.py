"""Create the first admin account on a fresh database and say how to sign in.

`make run` calls this on every start; it does nothing once any user exists. The password
comes from OPENWORKER_ADMIN_PASSWORD when set (scripted set-ups, end-to-end tests),
otherwise it is generated and printed once: it is never written to disk.
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the first admin account if the database has no users."

    def add_arguments(self, parser) -> None:  # type: ignore[no-untyped-def]
        parser.add_argument(
            "--username", default=os.environ.get("OPENWORKER_ADMIN_USERNAME", "admin")
        )
        parser.add_argument("--url", default="http://127.0.0.1:8000")

    def handle(self, *args: object, username: str, url: str, **options: object) -> None:
        User = get_user_model()
        if User.objects.exists():
            self.stdout.write(
                f"Accounts exist. Sign in at {url}/ (forgot the admin password? "
                f"`.venv/bin/python manage.py changepassword {username}`)."
            )
            return
        password = os.environ.get("OPENWORKER_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS("Created the first admin account."))
        self.stdout.write(f"  Sign in at {url}/  username: {username}  password: {password}")
        self.stdout.write("  (shown once; change it under Password after signing in)")
