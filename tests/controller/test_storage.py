"""StorageService in memory-free reality (a temp dir), then the admin routes over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.controller.events.bus import EventBus
from agentic_sandbox.controller.storage import (
    MAX_PATH_BYTES,
    InvalidPath,
    ObjectNotFound,
    ObjectTooLarge,
    ScopeReadOnly,
    StorageService,
    is_textual,
    validate_media_type,
    validate_path,
)
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from agentic_sandbox.proto.ids import new_id
from tests.controller.conftest import ADMIN_TOKEN, OPERATOR_TOKEN, LiveController, LiveHostd, provision, wait_operation

IID = new_id()
OTHER = new_id()


@pytest.fixture
def service(tmp_path: Path) -> StorageService:
    return StorageService(tmp_path / "storage", EventBus(), max_object_bytes=1024)


# -- the path rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        f"{IID}/../{OTHER}/x",
        f"{IID}/..",
        f"{IID}/./x",
        f"{IID}//x",
        f"{IID}/x/",
        f"{IID}/a\\..\\b",
        f"{IID}/nul\x00byte",
        f"{IID}/new\nline",
        f"{IID}/.aiwg-tmp-1234",
        f"{IID}/" + "a" * 256,
        f"{IID}/" + "/".join(["d"] * 40),
        f"{IID}/" + "/".join(["d" * 200] * 6),
        "not-an-instance/x",
        IID,
        IID.upper() + "/x",
    ],
)
def test_bad_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidPath):
        validate_path("inbox", path)


def test_path_rules_per_scope() -> None:
    assert validate_path("global", "docs/readme.md").parts == ("docs", "readme.md")
    assert validate_path("outbox", f"{IID}/a/b.txt").parts == (IID, "a", "b.txt")
    # global has no owner segment; a literal "%2e%2e" (already decoded once) is just a name.
    assert validate_path("global", "%2e%2e/x").parts == ("%2e%2e", "x")
    with pytest.raises(InvalidPath):
        validate_path("nope", "x")
    with pytest.raises(InvalidPath):
        validate_path("global", "a/" * (MAX_PATH_BYTES // 2) + "a")


def test_media_types() -> None:
    assert validate_media_type("text/plain; charset=utf-8")
    for bad in ("text", "a/b\n", "/x", "x/"):
        with pytest.raises(ValueError):
            validate_media_type(bad)
    assert is_textual("application/json") and is_textual("text/markdown") and is_textual("application/ld+json")
    assert not is_textual("application/octet-stream") and not is_textual("image/png")


# -- round trips ---------------------------------------------------------------------------------


async def test_write_read_replace_delete(service: StorageService) -> None:
    path = f"{IID}/missions/m-001.json"
    meta, created = await service.write("inbox", path, b'{"a": 1}', "application/json")
    assert created and meta.size_bytes == 8 and meta.sha256 == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert meta.modified_at.endswith("Z")

    got = await service.read("inbox", path)
    assert got.data == b'{"a": 1}' and got.meta.media_type == "application/json"
    assert got.meta.sha256 == meta.sha256

    meta2, created2 = await service.write("inbox", path, b"\x00\xff", "application/octet-stream")
    assert not created2 and meta2.size_bytes == 2
    got = await service.read("inbox", path)
    assert got.data == b"\x00\xff" and got.meta.media_type == "application/octet-stream"

    await service.delete("inbox", path)
    with pytest.raises(ObjectNotFound):
        await service.read("inbox", path)
    with pytest.raises(ObjectNotFound):
        await service.delete("inbox", path)
    # No temp file and no stray sidecar left behind.
    leftovers = [p.name for p in (service.root / "inbox" / IID / "missions").iterdir()]
    assert leftovers == []
    assert list((service.root / ".meta" / "inbox").iterdir()) == []


async def test_scopes_are_separate_and_global_is_read_only(service: StorageService) -> None:
    await service.write("inbox", f"{IID}/x", b"in", "text/plain")
    with pytest.raises(ObjectNotFound):
        await service.read("outbox", f"{IID}/x")
    with pytest.raises(ObjectNotFound):
        await service.read("inbox", f"{OTHER}/x")
    with pytest.raises(ScopeReadOnly):
        await service.write("global", "x", b"", "text/plain")
    with pytest.raises(ScopeReadOnly):
        await service.delete("global", "x")
    (service.root / "global" / "shared.txt").write_bytes(b"operator file")
    got = await service.read("global", "shared.txt")
    assert got.data == b"operator file" and got.meta.media_type == "text/plain"


async def test_size_limit(service: StorageService) -> None:
    with pytest.raises(ObjectTooLarge):
        await service.write("outbox", f"{IID}/big", b"x" * 1025, "application/octet-stream")
    # An agent may write a bigger file directly: reads describe it without content.
    box = service.root / "outbox" / IID
    box.mkdir(parents=True)
    (box / "big.bin").write_bytes(b"y" * 5000)
    got = await service.read("outbox", f"{IID}/big.bin")
    assert got.data is None and got.meta.size_bytes == 5000
    assert got.meta.sha256 == hashlib.sha256(b"y" * 5000).hexdigest()
    meta, chunks = await service.stream("outbox", f"{IID}/big.bin")
    assert b"".join(chunks) == b"y" * 5000 and meta.size_bytes == 5000


async def test_media_type_sidecar_follows_the_bytes(service: StorageService) -> None:
    path = f"{IID}/notes.md"
    await service.write("outbox", path, b"# hi", "text/x-custom")
    assert (await service.read("outbox", path)).meta.media_type == "text/x-custom"
    # Rewritten behind our back: the stale sidecar no longer applies, the name decides.
    (service.root / "outbox" / IID / "notes.md").write_bytes(b"# changed")
    assert (await service.read("outbox", path)).meta.media_type == "text/markdown"


# -- symlinks and special files -------------------------------------------------------------------


async def test_symlink_escapes_are_refused(service: StorageService, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"top secret")
    await service.write("inbox", f"{IID}/ok", b"ok", "text/plain")
    await service.write("inbox", f"{OTHER}/theirs", b"theirs", "text/plain")
    box = service.root / "inbox" / IID
    os.symlink(secret, box / "file-link")
    os.symlink(tmp_path, box / "dir-link")
    os.symlink(service.root / "inbox" / OTHER, box / "other-box")

    for path in (f"{IID}/file-link", f"{IID}/dir-link/secret.txt", f"{IID}/other-box/theirs"):
        with pytest.raises(InvalidPath):
            await service.read("inbox", path)
    with pytest.raises(InvalidPath):
        await service.write("inbox", f"{IID}/dir-link/planted", b"x", "text/plain")
    assert not (tmp_path / "planted").exists()

    # A symlink as the last segment is refused by every verb: not followed, replaced or removed,
    # whether it points outside, inside the box, or nowhere.
    os.symlink(box / "ok", box / "inner-link")
    os.symlink(tmp_path / "nowhere", box / "dangling")
    for name in ("file-link", "inner-link", "dangling"):
        with pytest.raises(InvalidPath, match="symlink"):
            await service.read("inbox", f"{IID}/{name}")
        with pytest.raises(InvalidPath, match="symlink"):
            await service.write("inbox", f"{IID}/{name}", b"mine", "text/plain")
        with pytest.raises(InvalidPath, match="symlink"):
            await service.delete("inbox", f"{IID}/{name}")
        assert (box / name).is_symlink()
    assert secret.read_bytes() == b"top secret" and (box / "ok").read_bytes() == b"ok"
    assert not (tmp_path / "nowhere").exists()


async def test_instance_box_itself_a_symlink(service: StorageService, tmp_path: Path) -> None:
    await service.write("inbox", f"{OTHER}/theirs", b"theirs", "text/plain")
    os.symlink(service.root / "inbox" / OTHER, service.root / "inbox" / IID)
    with pytest.raises(InvalidPath):
        await service.read("inbox", f"{IID}/theirs")
    with pytest.raises(InvalidPath):
        await service.write("inbox", f"{IID}/new", b"x", "text/plain")
    assert not (service.root / "inbox" / OTHER / "new").exists()


async def test_directories_and_fifos_are_not_objects(service: StorageService) -> None:
    await service.write("outbox", f"{IID}/d/f", b"x", "text/plain")
    with pytest.raises(ObjectNotFound):
        await service.read("outbox", f"{IID}/d")
    with pytest.raises(ObjectNotFound):
        await service.delete("outbox", f"{IID}/d")
    with pytest.raises(InvalidPath):
        await service.write("outbox", f"{IID}/d", b"x", "text/plain")
    with pytest.raises(InvalidPath):  # a file in the middle of the path
        await service.write("outbox", f"{IID}/d/f/g", b"x", "text/plain")
    os.mkfifo(service.root / "outbox" / IID / "fifo")
    with pytest.raises(ObjectNotFound):  # opened non-blocking: a FIFO never hangs the read
        await service.read("outbox", f"{IID}/fifo")


# -- the admin routes over real HTTP ---------------------------------------------------------------

BASE = "/api/v2/admin/storage"


async def raw_http(url: str, method: str, target: str, token: str | None = ADMIN_TOKEN) -> tuple[int, dict]:
    """Send ``target`` byte for byte (httpx would normalize dot segments) and parse the answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        request = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 0\r\n\r\n"
        await stream.send_all(request.encode("latin-1"))
        data = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some()
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            while len(body) < int(headers.get("content-length", "0")):
                body += await stream.receive_some()
    return int(lines[0].split(" ", 2)[1]), json.loads(body) if body.strip() else {}


def storage_root(controller: LiveController) -> Path:
    return Path(controller.config.storage_dir)


@pytest.fixture
async def boxes(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    """Instances ``IID`` and ``OTHER`` in the catalog: made on hostd with those ids, then adopted
    by the controller (a write to a box needs its instance)."""
    async with open_hostd(hostd.socket_path) as client:
        for iid in (IID, OTHER):
            await client.call(m.InstanceProvisionRequest(instance_id=iid, name=f"box-{iid[-6:]}", start=False))
    for iid in (IID, OTHER):
        assert (await admin.get(f"/api/v2/admin/instances/{iid}")).status_code == 200


async def test_writes_need_the_instance_in_the_catalog(admin: httpx.AsyncClient) -> None:
    unknown = new_id()
    r = await admin.put(f"{BASE}/inbox/{unknown}/x.txt", json={"content": "nobody's"})
    assert r.status_code == 404 and r.json()["code"] == "instance.not_found", r.text
    # A destroyed instance's box takes no more writes.
    iid = (await provision(admin, "gone-soon"))["result"]["instance_id"]
    op = (await admin.post(f"/api/v2/admin/instances/{iid}/destroy")).json()
    assert (await wait_operation(admin, op["id"]))["state"] == "succeeded"
    r = await admin.put(f"{BASE}/outbox/{iid}/late.txt", json={"content": "too late"})
    assert r.status_code == 409 and r.json()["code"] == "instance.invalid_state", r.text
    # A bad path is still a bad path first.
    r = await admin.put(f"{BASE}/inbox/{unknown}/../x", json={"content": "x"})
    assert r.status_code == 422


async def test_json_and_raw_round_trips(admin: httpx.AsyncClient, boxes: None) -> None:
    text_path = f"{BASE}/inbox/{IID}/missions/m-001.json"
    r = await admin.put(text_path, json={"content": '{"mission": 1}'})
    assert r.status_code == 201, r.text
    meta = r.json()
    assert meta["media_type"] == "application/json" and meta["sha256"] == hashlib.sha256(b'{"mission": 1}').hexdigest()
    assert meta["scope"] == "inbox" and meta["path"] == f"{IID}/missions/m-001.json" and meta["size_bytes"] == 14

    r = await admin.get(text_path)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["content"] == '{"mission": 1}' and r.json()["sha256"] == meta["sha256"]

    blob = bytes(range(256)) * 4
    bin_path = f"{BASE}/outbox/{IID}/artifacts/blob.bin"
    r = await admin.put(bin_path, content=blob, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    r = await admin.put(bin_path, content=blob, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["sha256"] == hashlib.sha256(blob).hexdigest()

    got = (await admin.get(bin_path)).json()
    assert base64.b64decode(got["content_base64"]) == blob and "content" not in got
    raw = await admin.get(bin_path, headers={"Accept": "application/octet-stream"})
    assert raw.status_code == 200 and raw.content == blob
    assert raw.headers["content-type"] == "application/octet-stream"

    r = await admin.put(
        f"{BASE}/outbox/{IID}/pic.png",
        json={"media_type": "image/png", "content_base64": base64.b64encode(blob).decode()},
    )
    assert r.status_code == 201 and r.json()["media_type"] == "image/png"
    raw = await admin.get(f"{BASE}/outbox/{IID}/pic.png", headers={"Accept": "image/png"})
    assert raw.content == blob and raw.headers["content-type"] == "image/png"

    r = await admin.put(f"{BASE}/inbox/{IID}/note.txt", content=b"hi", headers={"Content-Type": "text/plain"})
    assert r.status_code == 201
    raw = await admin.get(f"{BASE}/inbox/{IID}/note.txt", headers={"Accept": "text/plain"})
    assert raw.text == "hi" and raw.headers["content-type"].startswith("text/plain")

    assert (await admin.delete(bin_path)).status_code == 204
    r = await admin.get(bin_path)
    assert r.status_code == 404 and r.json()["code"] == "storage.not_found"
    assert r.headers["content-type"] == "application/problem+json"
    assert (await admin.delete(bin_path)).status_code == 404


async def test_global_is_read_only(controller: LiveController, admin: httpx.AsyncClient) -> None:
    shared = storage_root(controller) / "global" / "docs"
    shared.mkdir(parents=True)
    (shared / "readme.md").write_bytes(b"# shared")
    r = await admin.get(f"{BASE}/global/docs/readme.md")
    assert r.status_code == 200 and r.json()["content"] == "# shared"
    for method in ("PUT", "DELETE"):
        r = await admin.request(method, f"{BASE}/global/docs/readme.md", json={"content": "x"})
        assert r.status_code == 403 and r.json()["code"] == "storage.scope_disabled", r.text
    assert (shared / "readme.md").read_bytes() == b"# shared"


TRAVERSALS = [
    f"{BASE}/inbox/{IID}/../{OTHER}/secret",
    f"{BASE}/inbox/{IID}/%2e%2e/{OTHER}/secret",
    f"{BASE}/inbox/{IID}/%2E%2E%2F{OTHER}%2Fsecret",
    f"{BASE}/inbox/{IID}/..%2f..%2f..%2fetc%2fpasswd",
    f"{BASE}/inbox/..%2F..%2F..%2Fetc%2Fpasswd",
    f"{BASE}/inbox//etc/passwd",
    f"{BASE}/inbox/%2Fetc%2Fpasswd",
    f"{BASE}/global/../inbox/{OTHER}/secret",
    f"{BASE}/global/%2e%2e/inbox/{OTHER}/secret",
    f"{BASE}/global//etc/passwd",
    f"{BASE}/global/a%5C..%5C..%5Cetc",
    f"{BASE}/inbox/{IID}/nul%00byte",
    f"{BASE}/inbox/{IID}/new%0Aline",
    f"{BASE}/inbox/{IID}/a%0A/../../{OTHER}/secret",
    f"{BASE}/outbox/{OTHER.upper()}/secret",
    f"{BASE}/outbox/not-an-instance/secret",
    "/api/v1/storage/inbox/" + f"{IID}/../{OTHER}/secret",
    "/api/v1/storage/inbox/" + f"{IID}/%2e%2e/{OTHER}/secret",
]


async def test_traversal_is_refused(controller: LiveController, admin: httpx.AsyncClient, boxes: None) -> None:
    r = await admin.put(f"{BASE}/inbox/{OTHER}/secret", json={"content": "other instance's"})
    assert r.status_code in (200, 201)
    for target, method in itertools.product(TRAVERSALS, ("GET", "PUT", "DELETE")):
        status, body = await raw_http(controller.url, method, target)
        # Refused as a bad path (422 naming it), or for global writes as read-only (403);
        # never 2xx, never a 404 that would mean "looked, found nothing" outside the scope.
        if status == 403:
            assert method != "GET" and body["code"] == "storage.scope_disabled", (method, target, body)
        else:
            assert status == 422, (method, target, status, body)
            assert body["code"] == "validation.failed" and body["errors"][0]["field"] == "path", body
    assert (await admin.get(f"{BASE}/inbox/{OTHER}/secret")).json()["content"] == "other instance's"


#: Percent-escapes that are not UTF-8: a lone byte, a truncated sequence, an overlong "/", a surrogate.
NOT_UTF8 = ["%ff.txt", "%fe.txt", "%80.txt", "a%c3.txt", "%c0%af.txt", "%ed%a0%80.txt"]


async def test_paths_that_are_not_utf8_are_refused(
    controller: LiveController, admin: httpx.AsyncClient, boxes: None
) -> None:
    # A real U+FFFD is a valid name; a byte that is not UTF-8 must never be mapped onto it.
    assert (await admin.put(f"{BASE}/outbox/{IID}/\ufffd.txt", json={"content": "replacement"})).status_code == 201
    assert (await admin.put(f"{BASE}/outbox/{IID}/caf%C3%A9.txt", json={"content": "utf-8"})).status_code == 201
    assert (await admin.get(f"{BASE}/outbox/{IID}/caf\u00e9.txt")).json()["content"] == "utf-8"
    for prefix in (BASE, "/api/v1/storage"):
        for name, method in itertools.product(NOT_UTF8, ("GET", "PUT", "DELETE")):
            status, body = await raw_http(controller.url, method, f"{prefix}/outbox/{IID}/{name}")
            assert status == 422, (prefix, method, name, status, body)
            assert body["code"] == "validation.failed" and body["errors"][0]["field"] == "path", body
    box = storage_root(controller) / "outbox" / IID
    assert sorted(p.name for p in box.iterdir()) == ["caf\u00e9.txt", "\ufffd.txt"]
    assert (await admin.get(f"{BASE}/outbox/{IID}/\ufffd.txt")).json()["content"] == "replacement"


async def test_symlink_escape_over_http(
    controller: LiveController, admin: httpx.AsyncClient, tmp_path: Path, boxes: None
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("do not leak")
    assert (await admin.put(f"{BASE}/outbox/{IID}/ok.txt", json={"content": "ok"})).status_code == 201
    assert (await admin.put(f"{BASE}/outbox/{OTHER}/theirs.txt", json={"content": "theirs"})).status_code == 201
    box = storage_root(controller) / "outbox" / IID
    os.symlink(secret, box / "leak")
    os.symlink(tmp_path, box / "leakdir")
    os.symlink(storage_root(controller) / "outbox" / OTHER, box / "neighbour")
    for path in ("leak", "leakdir/host-secret", "neighbour/theirs.txt"):
        r = await admin.get(f"{BASE}/outbox/{IID}/{path}")
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path", r.text
        r = await admin.get(f"{BASE}/outbox/{IID}/{path}", headers={"Accept": "application/octet-stream"})
        assert r.status_code == 422 and "do not leak" not in r.text
    r = await admin.put(f"{BASE}/outbox/{IID}/leakdir/planted", json={"content": "x"})
    assert r.status_code == 422
    assert not (tmp_path / "planted").exists() and secret.read_text() == "do not leak"
    # The link itself is neither replaced by a PUT nor removed by a DELETE (v2 and v1 alike).
    for prefix in (BASE, "/api/v1/storage"):
        for method in ("PUT", "DELETE"):
            r = await admin.request(method, f"{prefix}/outbox/{IID}/leak", json={"content": "overwritten"})
            assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path", (prefix, method, r.text)
    assert (box / "leak").is_symlink() and secret.read_text() == "do not leak"


async def test_validation_and_auth(controller: LiveController, admin: httpx.AsyncClient, boxes: None) -> None:
    path = f"{BASE}/inbox/{IID}/x.txt"
    cases = [
        ({"json": {}}, "content"),
        ({"json": {"content": "a", "content_base64": "YQ=="}}, "content"),
        ({"json": {"content_base64": "not base64!"}}, "content_base64"),
        ({"json": {"content": "a", "media_type": "nonsense"}}, "media_type"),
        ({"json": {"content": "a", "extra": 1}}, "extra"),
        ({"content": b"x", "headers": {"Content-Type": "bad type"}}, "media_type"),
    ]
    for kwargs, field in cases:
        r = await admin.put(path, **kwargs)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, r.text
    r = await admin.put(path, content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "validation.failed"
    r = await admin.get(f"{BASE}/elsewhere/{IID}/x")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "scope"
    r = await admin.put(path, content=b"x" * (17 * 1024 * 1024), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json"

    async with controller.client(None) as anon:
        r = await anon.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    async with controller.client(OPERATOR_TOKEN) as operator:
        assert (await operator.put(path, json={"content": "by operator"})).status_code == 201
        assert (await operator.get(path)).json()["content"] == "by operator"
        assert (await operator.delete(path)).status_code == 204


async def test_objects_over_the_limit_stream_raw(controller: LiveController, admin: httpx.AsyncClient) -> None:
    """An agent may leave a file bigger than the write limit: JSON describes it, raw streams it."""
    box = storage_root(controller) / "outbox" / IID
    box.mkdir(parents=True)
    big = os.urandom(1024) * (17 * 1024)  # 17 MiB, over the 16 MiB default
    (box / "big.bin").write_bytes(big)
    r = await admin.get(f"{BASE}/outbox/{IID}/big.bin")
    assert r.status_code == 200 and r.json()["size_bytes"] == len(big)
    assert "content" not in r.json() and "content_base64" not in r.json()
    assert r.json()["sha256"] == hashlib.sha256(big).hexdigest()
    r = await admin.get(f"{BASE}/outbox/{IID}/big.bin", headers={"Accept": "application/octet-stream"})
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(big)
    assert hashlib.sha256(r.content).hexdigest() == hashlib.sha256(big).hexdigest()
