"""Small shared helpers."""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """Logs a message at most once per ``interval_s`` per key (first one always), with the
    number of suppressed repeats, so a down server cannot flood vLLM's log."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0, clock=time.monotonic):
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, level: int, key: str, msg: str, *args) -> None:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last[0] < self._interval:
                self._last[key] = (last[0], last[1] + 1)
                return
            suppressed = last[1] if last else 0
            self._last[key] = (now, 0)
        if suppressed:
            msg = msg + " (%d similar messages suppressed)"
            args = args + (suppressed,)
        self._log.log(level, msg, *args)

    def reset(self, key: str) -> None:
        with self._lock:
            self._last.pop(key, None)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
