"""One clear line when a verb cannot listen where it was told to (no traceback)."""

from __future__ import annotations

import errno
import socket

from gpufleet.errors import UserError


def bind_error(e: OSError, host: str, port: int, flag: str = "--port") -> UserError:
    """A UserError for a failed bind: what is wrong and what to do."""
    where = f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return UserError(
            f"{where} is already in use (another server listens there)",
            field=flag,
            fix=f"stop that server, or pick a free port ({flag} 0 picks one)",
        )
    if e.errno == errno.EACCES:
        return UserError(
            f"no permission to listen on {where}",
            field=flag,
            fix="use a port above 1023, or run with the needed privileges",
        )
    if e.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(e, socket.gaierror):
        return UserError(
            f"cannot listen on {where}: no such local address",
            field="--host",
            fix="use an address of this machine, e.g. 127.0.0.1 or 0.0.0.0",
        )
    return UserError(f"cannot listen on {where}: {e.strerror or e}", field=flag)


def check_port_free(host: str, port: int, flag: str = "--port") -> None:
    """Raise a UserError now if (host, port) cannot be bound (port 0 always can)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise bind_error(e, host, port, flag) from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            s.bind(addr)
        except OSError as e:
            raise bind_error(e, host, port, flag) from None
