"""hostd's one connection to libvirt, and the rule for calling it: always from a worker thread.

libvirt-python is blocking (it releases the GIL while it waits), so every call runs through
:meth:`LibvirtLink.call` in a trio worker thread and never stalls hostd's event loop; each call is
bounded (:data:`CALL_TIMEOUT_S`). The connection is opened on first use and again after it broke;
:attr:`LibvirtLink.reason` says why libvirt cannot be used right now (None when it can), which is
what the VM provider reports as its availability. The link never retries a call: a failure is the caller's answer.

Errors become :class:`hostd.errors.RpcError` once, here: ``provider.unavailable`` when libvirt
cannot be reached (not installed, nothing listening, the connection died), ``provider.failed``
when libvirt answered with an error. :func:`lookup` answers None for a domain that does not exist.

libvirt-python prints every error to stderr unless an error handler is registered: the link
registers one that drops them (the errors are raised and reported through RPC anyway).
"""

from __future__ import annotations

import logging
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ...errors import RpcError

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Bound of one libvirt call; saving or restoring a guest's memory gets :data:`LONG_CALL_TIMEOUT_S`.
CALL_TIMEOUT_S = 60.0
LONG_CALL_TIMEOUT_S = 600.0
_handler_lock = threading.Lock()
_handler_registered = False


def libvirt_module() -> Any:
    """The libvirt module (an optional dependency: without it there is no VM runtime)."""
    global _handler_registered
    import libvirt

    with _handler_lock:
        if not _handler_registered:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
            _handler_registered = True
    return libvirt


def libvirt_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class LibvirtLink:
    """One libvirt connection to ``uri``; see the module docstring."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: Any = None
        self._lock = threading.Lock()
        # None until a connection attempt failed: the first call connects by itself, so a request
        # that arrives before the first probe is not refused for want of one.
        self.reason: str | None = None

    def _connect_sync(self) -> Any:
        with self._lock:
            if self._conn is not None:
                return self._conn
            try:
                libvirt = libvirt_module()
            except ImportError:
                self.reason = "libvirt-python is not installed"
                raise RpcError(ErrorCode.PROVIDER_UNAVAILABLE, self.reason, uri=self.uri) from None
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as exc:
                self.reason = f"cannot connect to libvirt at {self.uri}: {libvirt_error(exc)}"
                raise RpcError(ErrorCode.PROVIDER_UNAVAILABLE, self.reason, uri=self.uri) from None
            self.reason = None
            log.info("connected to libvirt at %s", self.uri)
            return self._conn

    def _broken(self, conn: Any, exc: BaseException) -> bool:
        """Whether ``exc`` came from a dead connection (then it is dropped, to be reopened)."""
        try:
            alive = bool(conn.isAlive())
        except Exception:
            alive = False
        if alive:
            return False
        with self._lock:
            if self._conn is conn:
                self._conn = None
                self.reason = f"the libvirt connection to {self.uri} broke: {libvirt_error(exc)}"
                log.warning("%s", self.reason)
        try:
            conn.close()
        except Exception:
            pass
        return True

    def call_sync(self, fn: Callable[[Any], T]) -> T:
        """``fn(connection)`` in the calling thread (a worker thread, see :meth:`call`)."""
        conn = self._connect_sync()
        libvirt = libvirt_module()
        try:
            return fn(conn)
        except libvirt.libvirtError as exc:
            if self._broken(conn, exc):
                raise RpcError(
                    ErrorCode.PROVIDER_UNAVAILABLE, self.reason or libvirt_error(exc), uri=self.uri
                ) from None
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"libvirt: {libvirt_error(exc)}", uri=self.uri) from None

    async def call(self, fn: Callable[[Any], T], *, timeout_s: float = CALL_TIMEOUT_S) -> T:
        """``fn(connection)`` in a worker thread, bounded: past ``timeout_s`` the thread is left
        to finish alone and the caller gets ``provider.unavailable`` (a wedged libvirtd must not
        hold a stop, which runs shielded, forever)."""
        try:
            with trio.fail_after(timeout_s):
                return await trio.to_thread.run_sync(self.call_sync, fn, abandon_on_cancel=True)
        except trio.TooSlowError:
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"libvirt at {self.uri} did not answer within {timeout_s:g} s",
                uri=self.uri,
            ) from None

    async def probe(self) -> str | None:
        """Connect if needed and check the connection; returns :attr:`reason`."""

        def check(conn: Any) -> None:
            conn.getLibVersion()

        try:
            await self.call(check)
        except RpcError:
            pass
        return self.reason

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self.reason = "hostd closed the libvirt connection"
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


def lookup(conn: Any, uuid: str) -> Any:
    """The domain with ``uuid``, or None if there is none (run inside :meth:`LibvirtLink.call`)."""
    libvirt = libvirt_module()
    try:
        return conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def existing(conn: Any, vm: m.VmDetail) -> Any:
    """The domain a VM instance's detail names; PROVIDER_FAILED if it is gone (in a worker thread)."""
    dom = lookup(conn, vm.uuid or "") if vm.uuid else None
    if dom is None:
        raise RpcError(ErrorCode.PROVIDER_FAILED, f"domain {vm.domain} no longer exists", domain=vm.domain)
    return dom


def is_active(dom: Any) -> bool:
    return bool(dom.isActive())


def is_no_domain(exc: BaseException) -> bool:
    libvirt = libvirt_module()
    return isinstance(exc, libvirt.libvirtError) and exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN


def channel_path(conn: Any, vm: m.VmDetail, name: str) -> str | None:
    """The host end (a unix socket libvirt made) of the running domain's virtio channel ``name``;
    None when the domain is not running or has no such channel."""
    dom = lookup(conn, vm.uuid or "")
    if dom is None or not is_active(dom):
        return None
    root = ET.fromstring(dom.XMLDesc(0))
    for channel in root.iterfind("devices/channel"):
        target, source = channel.find("target"), channel.find("source")
        if target is not None and target.get("name") == name and source is not None:
            return source.get("path")
    return None
