"""Cancellation that reaches the socket: Stop must end the upstream request, not just
the display. The engine holds the token; the transport registers a callback (it may run
on any thread) that cancels the read the request's task is awaiting, which closes the
in-flight response, so the read returns at once and the upstream sees the disconnect."""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelToken:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: S112 - closing an already-dead socket is fine
                continue

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` on cancel (at once if already cancelled); returns an unregister."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)

                def unregister() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return unregister
        callback()
        return lambda: None
