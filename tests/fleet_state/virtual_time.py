"""An asyncio event loop on virtual time, for running the live gateway's asyncio code
without waiting: when nothing is ready, the loop's clock jumps to its next timer.

Real asyncio (tasks, events, `wait_for` timeouts), no sleeping, no timing dependence. A
loop with nothing ready and no timer would wait for ever: that raises instead.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0

    def select(self, timeout: float | None = None) -> Any:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("the loop would wait for ever: nothing ready, no timer")
        self.now_s += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(selector=self._jumping)

    def time(self) -> float:
        return self._jumping.now_s


def run_virtual(coro: Any) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
