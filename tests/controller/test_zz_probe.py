from __future__ import annotations
import sys; sys.path.insert(0, "/tmp"); import probe_patch  # noqa

import httpx
import trio
from .conftest import LiveController, ADMIN_TOKEN


async def test_probe_raw(controller: LiveController) -> None:
    host, port = controller.url.removeprefix("http://").split(":")
    s = await trio.open_tcp_stream(host, int(port))
    head = (f"POST /api/v2/admin/loadouts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            "Content-Type: application/yaml\r\nContent-Length: 20000000\r\n\r\n").encode()
    await s.send_all(head)
    got = b""
    async def reader():
        nonlocal got
        while True:
            d = await s.receive_some(65536)
            print("recv", len(d), d[:120])
            if not d:
                print("EOF")
                return
            got += d
    async with trio.open_nursery() as n:
        n.start_soon(reader)
        sent = 0
        with trio.move_on_after(5):
            try:
                while sent < 20000000:
                    await s.send_all(b"x" * 65536)
                    sent += 65536
            except Exception as e:
                print("send err", repr(e))
        print("sent", sent)
        with trio.move_on_after(3):
            await trio.sleep(3)
        n.cancel_scope.cancel()

def test_zz_dump():
    import probe_patch
    prev = None
    for e in probe_patch.LOG:
        k = e[:2]
        if k != prev:
            print(e)
        prev = k
