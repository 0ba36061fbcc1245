"""The pure set stays pure: an unmarked test cannot open sockets or start processes."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

REFUSED = "mark it @pytest.mark.process"


def test_an_unmarked_test_cannot_listen_connect_or_spawn() -> None:
    with socket.socket() as s, pytest.raises(RuntimeError, match=REFUSED):
        s.bind(("127.0.0.1", 0))
    with socket.socket() as s, pytest.raises(RuntimeError, match=REFUSED):
        s.connect(("127.0.0.1", 9))
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    # An event loop (its self-pipe is a local socket pair) still works.
    assert asyncio.run(asyncio.sleep(0, result=7)) == 7


@pytest.mark.process
def test_a_marked_test_may() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] > 0
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0
