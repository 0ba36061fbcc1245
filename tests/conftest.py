"""Test-wide rules: tests that start processes or open network sockets say so.

A test marked `process` may start subprocesses, servers, process pools or clusters and
talk over loopback; every other test is pure and must not. The guard below turns an
unmarked test's attempt into a failure that names the marker, so `pytest -m "not
process"` (`make test-fast`) really is the quick, self-contained set.
"""

from __future__ import annotations

import multiprocessing.process
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

_NET_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class UnmarkedProcessTest(RuntimeError):
    pass


def _refuse(what: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise UnmarkedProcessTest(
            f"this test {what}: mark it @pytest.mark.process (or pytestmark for its module)"
        )

    return refuse


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test compiled modules (make sim-compiled) older than their sources."""
    from gpufleet.errors import UserError
    from gpufleet.native import refuse_stale_compiled

    try:
        refuse_stale_compiled()
    except UserError as e:
        pytest.exit(str(e), returncode=2)


@pytest.fixture(autouse=True, scope="session")
def _library_setup_done_once() -> None:
    """Let libraries do their one-time setup before the guard below watches.

    On a fresh machine matplotlib's first import builds its font cache by running
    `fc-list` in a subprocess; that is the library's setup, not the test's doing, and a
    pure plotting test that happens to import it first must not fail for it.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.font_manager
    except ImportError:  # the plot extra is optional
        pass


@pytest.fixture(autouse=True)
def _pure_unless_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("process") is not None:
        yield
        return
    real_connect, real_bind = socket.socket.connect, socket.socket.bind

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in _NET_FAMILIES:
            _refuse(f"opens a network connection to {address!r}")()
        real_connect(self, address)

    def bind(self: socket.socket, address: Any) -> None:
        if self.family in _NET_FAMILIES:
            _refuse(f"listens on {address!r}")()
        real_bind(self, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", _refuse("opens a network connection"))
        mp.setattr(socket.socket, "bind", bind)
        mp.setattr(subprocess.Popen, "__init__", _refuse("starts a subprocess"))
        mp.setattr(multiprocessing.process.BaseProcess, "start", _refuse("starts a process"))
        yield
