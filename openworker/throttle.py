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


class LoginThrottleBackend(AxesBackend):
    def authenticate(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request is None:
            return None
        return super().authenticate(request, *args, **kwargs)
