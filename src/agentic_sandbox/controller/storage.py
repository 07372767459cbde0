"""Agentshare storage: ``global`` (read-only), ``inbox`` and ``outbox`` (per instance).

Layout under the storage root::

    <root>/global/<path>                    operator-managed, read-only through the API
    <root>/inbox/<instance_id>/<path>       per instance, read-write
    <root>/outbox/<instance_id>/<path>      per instance, read-write
    <root>/.meta/<scope>/<sha256(path)>.json  media type sidecars (outside every scope)

Path rule (every scope): a path is one or more ``/``-separated segments. It may not start with
``/``, contain empty, ``.`` or ``..`` segments, a backslash, NUL or any other control character,
or a segment starting with ``.aiwg-`` (reserved for our temp files); it must be UTF-8 (a lone
surrogate is refused here, a percent-escape that is not UTF-8 by the HTTP routes, which see the
raw bytes); a segment is at most 255 bytes and the whole path at most 1024 bytes, 32 segments deep. In ``inbox`` and
``outbox`` the first segment must be an instance id (a lowercase UUID, the id the controller gave
the instance) and at least one segment must follow it: callers name the instance whose box they
mean, and each instance's box is its own scope (``<scope>/<instance_id>/``), so nothing reaches
another instance's objects.

Symlinks are never followed: every component is opened relative to its parent with
``O_NOFOLLOW`` (``openat``), so an agent that plants a symlink in its box cannot make the
controller read or write outside it, and there is no check-then-open race. A symlink met on the
way is refused as a path error, and so is one at the object's own name, by every verb (read with
``O_NOFOLLOW``; write and delete check with ``lstat`` relative to the parent's fd, and their
``renameat``/``unlinkat`` never follow a link planted after that check either).

Writes are atomic (temp file in the same directory, fsync, rename, fsync of the directory) and
bounded by ``max_object_bytes``. sha256 and size are computed from the bytes on every read, so
files an agent wrote directly are described truthfully; only the media type comes from the
sidecar, and only while the sidecar's sha256 still matches the content (else it is guessed from
the file name). Blocking file I/O runs in a worker thread (``trio.to_thread``).

Errors: members of the controller's family (:mod:`controller.errors`), so every surface
translates them with the rest::

    InvalidPath          a ValidationFailed (validation.failed, field "path")
    ScopeReadOnly        a Forbidden (storage.scope_disabled)
    ObjectNotFound       a NotFound (storage.not_found)
    ObjectTooLarge       a TooLarge (storage.too_large)
    StorageUnavailable   an Unavailable (storage.unavailable: the root cannot be used)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mimetypes
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import msgspec
import trio

from .errors import Forbidden, NotFound, TooLarge, Unavailable, ValidationFailed
from .events.bus import EventBus

Scope = Literal["global", "inbox", "outbox"]
SCOPES: tuple[Scope, ...] = ("global", "inbox", "outbox")
WRITABLE_SCOPES: frozenset[str] = frozenset({"inbox", "outbox"})

MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
MAX_DEPTH = 32
RESERVED_PREFIX = ".aiwg-"
DEFAULT_MAX_OBJECT_BYTES = 16 * 1024 * 1024
#: Objects larger than this are described without content in the JSON form (raw reads stream).
CHUNK_BYTES = 256 * 1024

INSTANCE_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MEDIA_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}(\s*;.*)?$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_TEXT_TYPES = re.compile(r"^(text/|application/(json|xml|yaml|x-yaml|toml|javascript|x-ndjson)\b|.*\+(json|xml)\b)")

_SYMLINK_REFUSED = "path is a symlink; symlinks are never followed, replaced or removed"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# ---------------------------------------------------------------------------------------------
# Errors.


class InvalidPath(ValidationFailed):
    def __init__(self, message: str) -> None:
        super().__init__([{"field": "path", "message": message, "code": "path.invalid"}])


class ScopeReadOnly(Forbidden):
    def __init__(self, scope: str) -> None:
        super().__init__("storage.scope_disabled", f"scope '{scope}' is read-only")
        self.scope = scope


class ObjectNotFound(NotFound):
    def __init__(self, scope: str, path: str) -> None:
        super().__init__("storage.not_found", f"no object at {scope}/{path}")


class ObjectTooLarge(TooLarge):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__("storage.too_large", f"object of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class StorageUnavailable(Unavailable):
    """The storage root is missing or unusable (disk error, permissions)."""

    def __init__(self, message: str) -> None:
        super().__init__("storage.unavailable", message)


# ---------------------------------------------------------------------------------------------
# Boundary types.


class StorageObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON form of an object (admin-api ``StorageObject``)."""

    scope: str
    path: str
    media_type: str
    size_bytes: int
    sha256: str
    modified_at: str
    content: str | None = None
    content_base64: str | None = None


class _Sidecar(msgspec.Struct, kw_only=True):
    path: str
    media_type: str
    sha256: str


@dataclass(frozen=True, slots=True)
class ObjectData:
    """An object read whole: its description and bytes (``data`` is None when over the limit)."""

    meta: StorageObject
    data: bytes | None


@dataclass(frozen=True, slots=True)
class _Target:
    scope: str
    path: str  # the normalized caller path (scope-relative, owner id first for inbox/outbox)
    parts: tuple[str, ...]  # directory components below the scope dir, then the object name


# ---------------------------------------------------------------------------------------------
# Pure helpers.


def validate_path(scope: str, path: str) -> _Target:
    """Check ``path`` against the path rule of the module docstring; raise InvalidPath."""
    if scope not in SCOPES:
        raise InvalidPath(f"unknown scope '{scope}'")
    if not path:
        raise InvalidPath("path is empty")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidPath(f"path is longer than {MAX_PATH_BYTES} bytes")
    if _CONTROL_RE.search(path):
        raise InvalidPath("path contains a control character")
    if "\\" in path:
        raise InvalidPath("path contains a backslash")
    if path.startswith("/"):
        raise InvalidPath("path is absolute")
    parts = tuple(path.split("/"))
    if len(parts) > MAX_DEPTH:
        raise InvalidPath(f"path is deeper than {MAX_DEPTH} segments")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidPath("path has an empty, '.' or '..' segment")
        try:
            encoded = part.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidPath("path is not valid UTF-8") from None
        if len(encoded) > MAX_SEGMENT_BYTES:
            raise InvalidPath(f"a path segment is longer than {MAX_SEGMENT_BYTES} bytes")
        if part.startswith(RESERVED_PREFIX):
            raise InvalidPath(f"path segments may not start with '{RESERVED_PREFIX}'")
    if scope in WRITABLE_SCOPES:
        if not INSTANCE_ID_RE.match(parts[0]):
            raise InvalidPath(f"{scope} paths start with the instance id: <instance_id>/<name>")
        if len(parts) < 2:
            raise InvalidPath(f"{scope} paths name an object below the instance id: <instance_id>/<name>")
    return _Target(scope=scope, path=path, parts=parts)


def is_textual(media_type: str) -> bool:
    return bool(_TEXT_TYPES.match(media_type.lower()))


def validate_media_type(media_type: str) -> str:
    """Return the media type if it is ``type/subtype[; params]`` and printable; else ValueError."""
    if len(media_type) > 255 or _CONTROL_RE.search(media_type) or not MEDIA_TYPE_RE.match(media_type):
        raise ValueError("media_type must look like type/subtype")
    return media_type


def guess_media_type(name: str) -> str:
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or "application/octet-stream"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _sidecar_name(target: _Target) -> str:
    return hashlib.sha256(target.path.encode()).hexdigest() + ".json"


# ---------------------------------------------------------------------------------------------
# The service.


class StorageService:
    """Reads and writes objects under ``root``; see the module docstring for rules and layout.

    Every public method is async and does its file I/O in a worker thread. Errors are the ones
    listed in the module docstring; any other OSError from the root becomes ``StorageUnavailable``.
    """

    def __init__(self, root: Path, events: EventBus, *, max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES) -> None:
        self.root = Path(root)
        self.events = events
        self.max_object_bytes = max_object_bytes
        self._prepared = False

    # -- public API ---------------------------------------------------------------------------

    async def read(self, scope: str, path: str) -> ObjectData:
        """The object's description and, when it is at most ``max_object_bytes``, its bytes."""
        target = validate_path(scope, path)
        return await trio.to_thread.run_sync(self._read_sync, target)

    async def stream(self, scope: str, path: str) -> tuple[StorageObject, Iterator[bytes]]:
        """Description plus a chunk iterator (run each ``next`` in a thread) for raw reads."""
        target = validate_path(scope, path)
        obj = await trio.to_thread.run_sync(self._read_sync, target, True)
        return obj.meta, self._chunks(target)

    async def write(self, scope: str, path: str, data: bytes, media_type: str) -> tuple[StorageObject, bool]:
        """Create or replace the object; return its description and whether it was created."""
        if scope in SCOPES and scope not in WRITABLE_SCOPES:
            raise ScopeReadOnly(scope)
        target = validate_path(scope, path)
        if len(data) > self.max_object_bytes:
            raise ObjectTooLarge(len(data), self.max_object_bytes)
        obj, created = await trio.to_thread.run_sync(self._write_sync, target, data, media_type)
        self.events.storage_written(scope, path, size_bytes=obj.size_bytes, sha256=obj.sha256, created=created)
        return obj, created

    async def delete(self, scope: str, path: str) -> None:
        if scope in SCOPES and scope not in WRITABLE_SCOPES:
            raise ScopeReadOnly(scope)
        target = validate_path(scope, path)
        await trio.to_thread.run_sync(self._delete_sync, target)
        self.events.storage_deleted(scope, path)

    # -- directory walking (no symlinks, ever) ------------------------------------------------

    def _prepare(self) -> None:
        if self._prepared:
            return
        try:
            for sub in (*SCOPES, ".meta"):
                (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o750)
            for scope in SCOPES:
                (self.root / ".meta" / scope).mkdir(exist_ok=True, mode=0o750)
        except OSError as exc:
            raise StorageUnavailable(f"storage root {self.root} is unusable: {exc.strerror}") from exc
        self._prepared = True

    @contextlib.contextmanager
    def _open_parent(self, target: _Target, *, create: bool) -> Iterator[int]:
        """Yield an fd of the object's parent directory, walked with O_NOFOLLOW from the scope dir."""
        self._prepare()
        try:
            fd = os.open(self.root / target.scope, _DIR_FLAGS)
        except OSError as exc:
            raise StorageUnavailable(f"scope directory unusable: {exc.strerror}") from exc
        try:
            for part in target.parts[:-1]:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o750, dir_fd=fd)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise ObjectNotFound(target.scope, target.path) from None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise InvalidPath("path goes through a symlink or a file; symlinks are not followed") from None
                    raise
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _open_object(self, target: _Target) -> int:
        with self._open_parent(target, create=False) as dfd:
            try:
                fd = os.open(target.parts[-1], _READ_FLAGS, dir_fd=dfd)
            except FileNotFoundError:
                raise ObjectNotFound(target.scope, target.path) from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InvalidPath(_SYMLINK_REFUSED) from None
                raise
        st = os.fstat(fd)
        if not _is_regular(st.st_mode):
            os.close(fd)
            raise ObjectNotFound(target.scope, target.path)
        # O_NONBLOCK only kept a planted FIFO from hanging the open; regular files ignore it.
        os.set_blocking(fd, True)
        return fd

    # -- sync bodies (worker threads) ---------------------------------------------------------

    def _read_sync(self, target: _Target, hash_only: bool = False) -> ObjectData:
        try:
            fd = self._open_object(target)
            try:
                st = os.fstat(fd)
                digest = hashlib.sha256()
                keep = not hash_only and st.st_size <= self.max_object_bytes
                chunks: list[bytes] = []
                total = 0
                while chunk := os.read(fd, CHUNK_BYTES):
                    digest.update(chunk)
                    total += len(chunk)
                    if keep:
                        chunks.append(chunk)
                        if total > self.max_object_bytes:  # the file grew while we read it
                            keep, chunks = False, []
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {target.scope}/{target.path}: {exc.strerror}") from exc
        sha = digest.hexdigest()
        data = b"".join(chunks) if keep else None
        meta = StorageObject(
            scope=target.scope,
            path=target.path,
            media_type=self._media_type(target, sha),
            size_bytes=total,
            sha256=sha,
            modified_at=_iso(st.st_mtime),
        )
        return ObjectData(meta=meta, data=data)

    def _chunks(self, target: _Target) -> Iterator[bytes]:
        fd = self._open_object(target)
        try:
            while chunk := os.read(fd, CHUNK_BYTES):
                yield chunk
        finally:
            os.close(fd)

    def _write_sync(self, target: _Target, data: bytes, media_type: str) -> tuple[StorageObject, bool]:
        name = target.parts[-1]
        try:
            with self._open_parent(target, create=True) as dfd:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    created = True
                else:
                    if _is_symlink(st.st_mode):
                        raise InvalidPath(_SYMLINK_REFUSED)
                    if not _is_regular(st.st_mode):
                        raise InvalidPath("path names a directory or a special file")
                    created = False
                # rename never follows a symlink at the target name: one planted between the
                # check above and here is replaced itself, and nothing outside the box is touched.
                _atomic_write(dfd, name, data)
                mtime = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime
            sha = hashlib.sha256(data).hexdigest()
            self._write_sidecar(target, _Sidecar(path=target.path, media_type=media_type, sha256=sha))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
                raise StorageUnavailable(f"cannot write {target.scope}/{target.path}: {exc.strerror}") from exc
            if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP):
                raise InvalidPath(f"cannot write there: {exc.strerror}") from exc
            raise StorageUnavailable(f"cannot write {target.scope}/{target.path}: {exc.strerror}") from exc
        meta = StorageObject(
            scope=target.scope,
            path=target.path,
            media_type=media_type,
            size_bytes=len(data),
            sha256=sha,
            modified_at=_iso(mtime),
        )
        return meta, created

    def _delete_sync(self, target: _Target) -> None:
        try:
            with self._open_parent(target, create=False) as dfd:
                try:
                    st = os.stat(target.parts[-1], dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    raise ObjectNotFound(target.scope, target.path) from None
                if _is_symlink(st.st_mode):
                    raise InvalidPath(_SYMLINK_REFUSED)
                if not _is_regular(st.st_mode):
                    raise ObjectNotFound(target.scope, target.path)
                # unlinkat never follows a symlink: one planted since the check goes, not its target.
                os.unlink(target.parts[-1], dir_fd=dfd)
                os.fsync(dfd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / ".meta" / target.scope / _sidecar_name(target))
        except OSError as exc:
            raise StorageUnavailable(f"cannot delete {target.scope}/{target.path}: {exc.strerror}") from exc

    # -- media type sidecars ------------------------------------------------------------------

    def _media_type(self, target: _Target, sha: str) -> str:
        sidecar_path = self.root / ".meta" / target.scope / _sidecar_name(target)
        try:
            sidecar = msgspec.json.decode(sidecar_path.read_bytes(), type=_Sidecar)
        except (OSError, msgspec.DecodeError):
            return guess_media_type(target.parts[-1])
        if sidecar.path != target.path or sidecar.sha256 != sha:
            # The bytes changed behind our back (an agent wrote the file directly).
            return guess_media_type(target.parts[-1])
        return sidecar.media_type

    def _write_sidecar(self, target: _Target, sidecar: _Sidecar) -> None:
        dfd = os.open(self.root / ".meta" / target.scope, _DIR_FLAGS)
        try:
            _atomic_write(dfd, _sidecar_name(target), msgspec.json.encode(sidecar))
        finally:
            os.close(dfd)


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def _is_symlink(mode: int) -> bool:
    return stat.S_ISLNK(mode)


def _atomic_write(dfd: int, name: str, data: bytes) -> None:
    """Write ``name`` in directory ``dfd`` all at once: temp file, fsync, rename, fsync dir."""
    tmp = f"{RESERVED_PREFIX}tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    os.fsync(dfd)
