"""Loadouts: YAML manifests that name an instance's agent command and its runtime needs.

A manifest (``yaml.safe_load``; aliases refused, at most ``MAX_MANIFEST_BYTES``) is validated into
``LoadoutManifest`` (unknown keys refused, so a typo is an error rather than a silent default)::

    name: echo                 # same pattern as instance names: ^[a-z][a-z0-9-]{1,62}$
    version: "1"               # a number is accepted and kept as text
    runtime: host              # host | docker | qemu
    description: ...           # optional
    command: [/bin/cat]        # argv of the agent command: what hostd runs for tasks
    image: localhost/busybox   # docker only: the image its instances run (OCI reference)
    runtime_options: {...}     # optional, admin-api LoadoutRuntimeOptions
    compatibility: [...]       # optional, admin-api LoadoutCompatibility; derived when absent

Built-in loadouts (``shell``, ``echo``; ``busybox`` for containers) ship as package data in
``controller/loadouts/``; user loadouts are saved as ``<dir>/<name>.yaml`` (the manifest text as uploaded) and loaded at
construction. Names are unique across both: creating an existing name (built-in included) raises
``LoadoutExists``. A file is published with ``link(2)`` from a temp file, so two creates of one
name never both win and a crash never leaves half a manifest.

Errors (members of :mod:`controller.errors`): ``LoadoutInvalid``, a ValidationFailed whose
``field`` names the offending field (e.g. ``manifest.command[0]``), and ``LoadoutExists``, a
Conflict (``loadout.already_exists``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import trio
import yaml

from agentic_sandbox.proto.messages import IdlePolicy

from ..errors import Conflict, ControllerError, ValidationFailed

log = logging.getLogger(__name__)

BUILTIN_DIR = Path(__file__).with_name("builtin")
NAME_PATTERN = r"^[a-z][a-z0-9-]{1,62}$"
MAX_MANIFEST_BYTES = 64 * 1024

LoadoutName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Capability = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Argv = Annotated[
    list[Annotated[str, msgspec.Meta(min_length=1, max_length=65536)]], msgspec.Meta(min_length=1, max_length=4096)
]
Text = Annotated[str, msgspec.Meta(max_length=4096)]


# ---------------------------------------------------------------------------------------------
# Errors.


class LoadoutInvalid(ValidationFailed):
    """The manifest (or the name given with it) breaks a rule; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__([{"field": field, "message": message, "code": "manifest.invalid"}])
        self.field = field


class LoadoutExists(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__("loadout.already_exists", f"a loadout named '{name}' already exists")
        self.name = name


# ---------------------------------------------------------------------------------------------
# The manifest (shapes follow admin-api LoadoutRuntimeOptions / LoadoutCompatibility).


class _Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Manifest parts: unknown keys are refused so that a misspelt key is reported."""


class LaunchStrategy(_Strict, kw_only=True):
    mode: Literal["cold", "restore", "fork", "warm_pool"]
    prefer_fast_start: bool = False
    asset_ref: Text | None = None
    restore_mode: Literal["ondemand", "copy"] | None = None


class RuntimeConstraints(_Strict, kw_only=True):
    allow_vfio_fast_start: bool | None = None
    fallback_mode: Literal["fail", "cold"] | None = None


class RuntimeOptions(_Strict, kw_only=True):
    kind: Literal["host", "container", "vm"] | None = None
    provider: Capability | None = None
    required_capabilities: list[Capability] = []
    excluded_capabilities: list[Capability] = []
    launch_strategy: LaunchStrategy | None = None
    constraints: RuntimeConstraints | None = None


class CapabilityConstraint(_Strict, kw_only=True):
    condition: Capability
    excludes: list[Capability]
    reason: Text


class Compatibility(_Strict, kw_only=True):
    runtime_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    provider: Capability
    eligible: bool
    required_capabilities: list[Capability] = []
    excluded_capabilities: list[Capability] = []
    constraints: list[CapabilityConstraint] = []
    launch_strategy: LaunchStrategy | None = None
    reason: Text | None = None


class LoadoutManifest(_Strict, kw_only=True):
    name: LoadoutName
    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    runtime: Literal["host", "docker", "qemu"]
    description: Text = ""
    #: The agent command: what each task runs (one exec per A2A task).
    command: Argv
    #: Optional long-running process hostd supervises as the instance's main process.
    service: Argv | None = None
    #: The image a docker-runtime instance runs (OCI reference), unless the request names one.
    image: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    runtime_options: RuntimeOptions | None = None
    compatibility: list[Compatibility] = []
    #: When its instances sleep by themselves (an instance's own ``idle`` overrides it): docs/sleep.md.
    idle: IdlePolicy | None = None


class LoadoutView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON form (admin-api ``Loadout``, plus ``command`` and ``builtin``)."""

    name: str
    version: str
    runtime: str
    description: str
    command: list[str]
    builtin: bool
    service: list[str] | None = None
    image: str | None = None
    runtime_options: RuntimeOptions | None = None
    compatibility: list[Compatibility] = []
    idle: IdlePolicy | None = None
    manifest: str | None = None


_RUNTIME_KIND = {"host": "host", "docker": "container", "qemu": "vm"}
_DEFAULT_PROVIDER = {"host": "host", "docker": "podman", "qemu": "libvirt"}


@dataclass(frozen=True, slots=True)
class Loadout:
    """A validated loadout: its manifest, the text it came from, and where it came from."""

    manifest: LoadoutManifest
    text: str
    builtin: bool

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def command(self) -> list[str]:
        return list(self.manifest.command)

    @property
    def service(self) -> list[str] | None:
        return list(self.manifest.service) if self.manifest.service else None

    @property
    def runtime(self) -> str:
        return self.manifest.runtime

    @property
    def image(self) -> str | None:
        return self.manifest.image

    @property
    def idle(self) -> IdlePolicy | None:
        return self.manifest.idle

    def view(self, *, with_manifest: bool = False) -> LoadoutView:
        m = self.manifest
        compatibility = m.compatibility or [
            Compatibility(
                runtime_kind=_RUNTIME_KIND[m.runtime],
                provider=(m.runtime_options.provider if m.runtime_options and m.runtime_options.provider else None)
                or _DEFAULT_PROVIDER[m.runtime],
                eligible=True,
                launch_strategy=m.runtime_options.launch_strategy if m.runtime_options else None,
            )
        ]
        return LoadoutView(
            name=m.name,
            version=m.version,
            runtime=m.runtime,
            description=m.description,
            command=list(m.command),
            service=list(m.service) if m.service else None,
            image=m.image,
            builtin=self.builtin,
            runtime_options=m.runtime_options,
            compatibility=compatibility,
            idle=m.idle,
            manifest=self.text if with_manifest else None,
        )


# ---------------------------------------------------------------------------------------------
# Parsing.


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: a few bytes of anchors can expand to gigabytes when walked."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)


def _field_of(exc: msgspec.ValidationError) -> tuple[str, str]:
    """Split msgspec's "Expected ... - at `$.a.b[0]`" into ("a.b[0]", "Expected ...")."""
    text = str(exc)
    match = re.search(r" - at `\$\.?(.*)`$", text)
    message, path = (text[: match.start()], match.group(1)) if match else (text, "")
    # A missing or unknown key is reported at its parent object; name the key itself.
    key = re.match(r"Object (?:missing required|contains unknown) field `([^`]+)`", message)
    if key:
        path = f"{path}.{key.group(1)}" if path else key.group(1)
    return path, message


def parse_manifest(text: str, *, name: str | None = None, builtin: bool = False) -> Loadout:
    """Parse and validate one manifest; ``name`` (if given) fills in or must match its ``name``."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MANIFEST_BYTES:
        raise LoadoutInvalid("manifest", f"manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as exc:
        raise LoadoutInvalid("manifest", f"invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise LoadoutInvalid("manifest", "the manifest must be a YAML mapping")
    if name is not None:
        if "name" not in data:
            data["name"] = name
        elif data["name"] != name:
            raise LoadoutInvalid("name", f"does not match the manifest's name '{data['name']}'")
    if isinstance(data.get("version"), int | float) and not isinstance(data.get("version"), bool):
        data["version"] = str(data["version"])
    try:
        manifest = msgspec.convert(data, LoadoutManifest, strict=True)
    except msgspec.ValidationError as exc:
        path, message = _field_of(exc)
        raise LoadoutInvalid(f"manifest.{path}" if path else "manifest", message) from None
    _check_unique(manifest)
    return Loadout(manifest=manifest, text=text, builtin=builtin)


def _check_unique(m: LoadoutManifest) -> None:
    """The API schema says capability lists have unique items; refuse duplicates up front."""

    def check(values: Iterable[str], field: str) -> None:
        values = list(values)
        if len(values) != len(set(values)):
            raise LoadoutInvalid(field, "items must be unique")

    if m.runtime_options is not None:
        check(m.runtime_options.required_capabilities, "manifest.runtime_options.required_capabilities")
        check(m.runtime_options.excluded_capabilities, "manifest.runtime_options.excluded_capabilities")
    for i, c in enumerate(m.compatibility):
        check(c.required_capabilities, f"manifest.compatibility[{i}].required_capabilities")
        check(c.excluded_capabilities, f"manifest.compatibility[{i}].excluded_capabilities")
        for j, constraint in enumerate(c.constraints):
            check(constraint.excludes, f"manifest.compatibility[{i}].constraints[{j}].excludes")


# ---------------------------------------------------------------------------------------------
# The service.


class LoadoutService:
    """Built-in and user loadouts; user loadouts persist as YAML files in ``directory``.

    Construction reads every manifest once (startup, synchronous); a user file that fails
    validation or shadows a built-in name is logged and skipped, never fatal. ``create`` writes
    in a worker thread; a lock orders creates within this process and ``link(2)`` refuses a name
    taken by anyone else.
    """

    def __init__(self, directory: Path, *, builtin_dir: Path = BUILTIN_DIR) -> None:
        self.directory = Path(directory)
        self._loadouts: dict[str, Loadout] = {}
        self._lock = trio.Lock()
        for path in sorted(builtin_dir.glob("*.yaml")):
            loadout = parse_manifest(path.read_text("utf-8"), name=path.stem, builtin=True)
            self._loadouts[loadout.name] = loadout
        self._load_user()

    def _load_user(self) -> None:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.yaml")):
            if path.stem in self._loadouts:
                log.warning("loadout file %s shadows a built-in loadout; ignored", path)
                continue
            try:
                loadout = parse_manifest(path.read_text("utf-8"), name=path.stem)
            except (OSError, UnicodeDecodeError, ControllerError) as exc:
                log.warning("loadout file %s skipped: %s", path, exc)
                continue
            self._loadouts[loadout.name] = loadout

    def get(self, name: str) -> Loadout | None:
        return self._loadouts.get(name)

    def list(self) -> list[Loadout]:
        """Built-ins first, then user loadouts, each group by name."""
        return sorted(self._loadouts.values(), key=lambda lo: (not lo.builtin, lo.name))

    async def create(self, manifest_text: str, *, name: str | None = None) -> Loadout:
        """Validate and persist a new loadout; ``name`` comes from the request when given."""
        if name is not None and not re.match(NAME_PATTERN, name):
            raise LoadoutInvalid("name", f"must match {NAME_PATTERN}")
        if name is not None and name in self._loadouts:
            raise LoadoutExists(name)  # a taken name is the answer whatever the manifest says
        loadout = parse_manifest(manifest_text, name=name)
        async with self._lock:
            if loadout.name in self._loadouts:
                raise LoadoutExists(loadout.name)
            await trio.to_thread.run_sync(self._publish, loadout)
            self._loadouts[loadout.name] = loadout
        return loadout

    def _publish(self, loadout: Loadout) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        final = self.directory / f"{loadout.name}.yaml"
        tmp = self.directory / f".tmp-{secrets.token_hex(8)}"
        try:
            with open(tmp, "x", encoding="utf-8") as fh:
                fh.write(loadout.text)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, final)  # fails if the name exists: no silent replace
            except FileExistsError:
                raise LoadoutExists(loadout.name) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
