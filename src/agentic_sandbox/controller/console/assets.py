"""The web console's built files, read once at start: everything ``/console/`` serves.

``scripts/build-console.py`` writes them to ``controller/console/build/`` (ignored by git, shipped in
the wheel as package data): the page, scripts and styles of ``console/src/`` and, under ``vendor/``,
xterm.js and its fit addon as npm installed them from ``console/package-lock.json``, with their
licences. ``build/manifest.json`` lists every file and the versions of the npm packages.

Only the files the manifest lists are served, from memory, by name: a request path is a key in a
dict, never joined onto a directory, so no path can reach outside the build. A file of a type not in
:data:`CONTENT_TYPES` or larger than :data:`MAX_FILE_BYTES` stops the load (a broken build is said
at start, not served). :meth:`ConsoleAssets.load` never raises: without a build, or with a broken
one, it answers an empty set whose :attr:`~ConsoleAssets.missing` says why and how to build it (the
controller logs it at start and the routes answer 503 with it; the APIs are served either way).

The page (``index.html``) holds :data:`NONCE_MARK` once: each response puts a fresh CSP nonce there
(see :mod:`controller.console.routes` for why the page needs one).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path, PurePosixPath

import msgspec

log = logging.getLogger(__name__)

BUILD_DIR = Path(__file__).resolve().parent / "build"
MANIFEST = "manifest.json"
INDEX = "index.html"
NONCE_MARK = b"__CSP_NONCE__"
MAX_FILE_BYTES = 4 * 1024 * 1024
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
BUILD_HINT = "build it with `make console` (or `python3 scripts/build-console.py`)"


class Asset(msgspec.Struct, frozen=True, kw_only=True):
    body: bytes
    content_type: str
    etag: str


class Manifest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    files: list[str]
    #: npm package name -> version (``@xterm/xterm``, ``@xterm/addon-fit``).
    packages: dict[str, str]


class ConsoleBuildError(Exception):
    """The build folder exists but cannot be served as it is (a broken or tampered build)."""


class ConsoleAssets:
    """The served files by name (``index.html``, ``app.js``, ``vendor/xterm.mjs``...)."""

    def __init__(self, files: dict[str, Asset], packages: dict[str, str], *, missing: str | None = None) -> None:
        self._files = files
        self.packages = packages
        #: Why there is nothing to serve (None when the build is there).
        self.missing = missing
        index = files.get(INDEX)
        self._index_parts = index.body.split(NONCE_MARK) if index is not None else None

    @classmethod
    def load(cls, directory: Path = BUILD_DIR) -> ConsoleAssets:
        try:
            return cls._load(directory)
        except ConsoleBuildError as exc:
            return cls({}, {}, missing=f"the web console's build is broken: {exc}")

    @classmethod
    def _load(cls, directory: Path) -> ConsoleAssets:
        try:
            raw = (directory / MANIFEST).read_bytes()
        except FileNotFoundError:
            return cls({}, {}, missing=f"the web console is not built ({directory} has no {MANIFEST}); {BUILD_HINT}")
        try:
            manifest = msgspec.json.decode(raw, type=Manifest)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConsoleBuildError(f"{directory / MANIFEST}: {exc}; {BUILD_HINT}") from None
        files = {name: _read(directory, name) for name in manifest.files}
        assets = cls(files, dict(manifest.packages))
        if assets._index_parts is None or len(assets._index_parts) != 2:
            raise ConsoleBuildError(f"{directory / INDEX} must exist and hold the nonce mark once; {BUILD_HINT}")
        return assets

    def get(self, name: str) -> Asset | None:
        return self._files.get(name)

    def index(self, nonce: str) -> bytes:
        """The page with ``nonce`` in its one nonce slot."""
        assert self._index_parts is not None, "no page in an unbuilt console"
        head, tail = self._index_parts
        return head + nonce.encode() + tail


def _read(directory: Path, name: str) -> Asset:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or name != path.as_posix():
        raise ConsoleBuildError(f"{MANIFEST} names {name!r}, which is not a plain relative path")
    content_type = CONTENT_TYPES.get(path.suffix)
    if content_type is None:
        raise ConsoleBuildError(f"{MANIFEST} names {name!r}, a type the console does not serve")
    try:
        body = (directory / name).read_bytes()
    except OSError as exc:
        raise ConsoleBuildError(f"{directory / name}: {exc.strerror}; {BUILD_HINT}") from None
    if len(body) > MAX_FILE_BYTES:
        raise ConsoleBuildError(f"{directory / name} is larger than {MAX_FILE_BYTES} bytes")
    return Asset(body=body, content_type=content_type, etag='"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def describe(assets: ConsoleAssets) -> str:
    """One log line: what is served, or why nothing is."""
    if assets.missing is not None:
        return assets.missing
    return "web console: " + json.dumps(assets.packages, sort_keys=True)
