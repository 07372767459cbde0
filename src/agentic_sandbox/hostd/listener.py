"""The RPC socket file: claim it safely, hand it out, remove only our own.

hostd refuses to start while another hostd answers on the socket path. A socket file that
nobody accepts on is stale (its hostd died) and is removed; anything at the path that is not a
socket is left alone and hostd refuses to start, so a typo in the configuration never deletes
an unrelated file.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import socket
import stat
from pathlib import Path

import trio

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128


class SocketInUse(RuntimeError):
    """Another process answers on the socket path, or something else occupies it."""


def _probe_listening(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # EAGAIN: a full backlog means somebody listens.
        return exc.errno == 11
    finally:
        probe.close()


def claim_path(path: str) -> None:
    """Make the path free for bind(), or raise SocketInUse."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    if _probe_listening(path):
        raise SocketInUse(f"another hostd is already listening on {path}")
    log.warning("removing stale socket %s (nothing listens on it)", path)
    os.unlink(path)


class BoundSocket:
    """A listening Unix socket plus the identity of the file we created for it."""

    def __init__(self, sock: trio.socket.SocketType, path: str, ino: tuple[int, int]) -> None:
        self.sock = sock
        self.path = path
        self._ino = ino

    @property
    def ino(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the socket file this socket is bound to."""
        return self._ino

    @classmethod
    def adopt(cls, fd: int, path: str, ino: tuple[int, int]) -> BoundSocket:
        """The listening socket an earlier image of hostd handed over (still bound and listening:
        clients that connected meanwhile wait in its backlog)."""
        os.set_inheritable(fd, False)
        return cls(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)), path, ino)

    def remove_own_file(self) -> None:
        """Unlink the socket file only if it is still the one we bound."""
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._ino:
                os.unlink(self.path)
            else:
                log.warning("socket %s was replaced by someone else; leaving it", self.path)


async def bind_unix(path: str, *, mode: int, group: str | None = None) -> BoundSocket:
    parent = Path(path).parent
    parent.mkdir(parents=True, exist_ok=True)
    claim_path(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # A umask that keeps the file private until chmod closes the window between bind and chmod.
        old_umask = os.umask(0o177)
        try:
            await sock.bind(path)
        finally:
            os.umask(old_umask)
        if group:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        os.chmod(path, mode)
        sock.listen(LISTEN_BACKLOG)
        st = os.lstat(path)
    except BaseException:
        sock.close()
        raise
    return BoundSocket(sock, path, (st.st_dev, st.st_ino))


def peer_credentials(sock: trio.socket.SocketType) -> tuple[int, int, int]:
    """(pid, uid, gid) of the connected peer, from SO_PEERCRED."""
    import struct

    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
