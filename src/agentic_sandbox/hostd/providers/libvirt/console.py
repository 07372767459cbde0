"""``python -m agentic_sandbox.hostd.providers.libvirt.console URI UUID``: relay a VM's serial console
to the terminal it runs on.

hostd runs this on a PTY it owns when a session is created in a VM instance
(:meth:`hostd.providers.libvirt.provider.VmProvider.spawn_spec`), so the console's output goes into the session's
ring like any PTY session's, and replay, lag handling and reattach are the same. It opens the
domain's console with ``virDomainOpenConsole`` on a blocking libvirt stream; a worker thread reads
the stream and writes what arrives to stdout, the main thread reads stdin and sends it. The
terminal is put in raw mode: the guest's own line discipline echoes and edits, not the host PTY's.

It exits when the console stream ends (the guest shut off: code 0), when libvirt fails (a message
on the terminal, code 1: e.g. another console session already holds this domain's console) or on
SIGTERM/SIGHUP (the session was killed; the VM keeps running).

Creates no process; imports libvirt, so only hostd runs it.
"""

from __future__ import annotations

import os
import signal
import sys
import termios
import threading
import tty
from typing import Any

from agentic_sandbox.hostd.providers.libvirt.connection import libvirt_error, libvirt_module

CHUNK = 64 * 1024


def _reader(stream: Any, done: threading.Event) -> None:
    try:
        while True:
            data = stream.recv(CHUNK)
            if not data or isinstance(data, int):  # 0 bytes: end of stream; ints: not on a blocking stream
                break
            os.write(1, data)
    except Exception as exc:
        os.write(2, f"\r\n[console closed: {libvirt_error(exc)}]\r\n".encode())
    finally:
        done.set()
        # The main thread is blocked reading the terminal: wake it (the guest shut off, say).
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m agentic_sandbox.hostd.providers.libvirt.console URI UUID", file=sys.stderr)
        return 2
    uri, uuid = argv
    libvirt = libvirt_module()
    if os.isatty(0):
        tty.setraw(0, termios.TCSANOW)
    try:
        conn = libvirt.open(uri)
        dom = conn.lookupByUUIDString(uuid)
        stream = conn.newStream(0)
        dom.openConsole(None, stream, 0)
    except libvirt.libvirtError as exc:
        os.write(1, f"cannot open the console of domain {uuid}: {libvirt_error(exc)}\r\n".encode())
        return 1
    done = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        done.set()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    threading.Thread(target=_reader, args=(stream, done), daemon=True).start()
    try:
        while not done.is_set():
            data = os.read(0, CHUNK)
            if not data:
                break
            stream.send(data)
    except (OSError, libvirt.libvirtError):
        pass
    finally:
        done.wait(0.2)
        try:
            stream.abort()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
