"""Login throttling: django-axes' lockout, as the first authentication backend.

django-axes counts failed sign-ins per (username, client IP) and refuses further
attempts for a cool-off period once `AXES_FAILURE_LIMIT` is reached, even with the right
password. Its backend insists on a request; `authenticate()` without one (the test
client's `login()`, a management shell) has no client to throttle, so this backend
steps aside there and `ModelBackend` decides. A web sign-in always carries a request.
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesBackend
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied

from sessions.sso.policy import password_sign_in_allowed


class LoginThrottleBackend(AxesBackend):
    def authenticate(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # Require-SSO: a password sign-in for anyone but a break-glass admin stops here,
        # before any backend looks at the password (PermissionDenied ends the chain).
        username = kwargs.get(get_user_model().USERNAME_FIELD, args[0] if args else None)
        if "password" in kwargs and not password_sign_in_allowed(username):
            raise PermissionDenied("password sign-in is turned off: sign in with SSO")
        if request is None:
            return None
        return super().authenticate(request, *args, **kwargs)
