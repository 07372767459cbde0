"""Settings both daemons load one way: one row per setting, one table per daemon.

A row (:class:`Setting`) names a field of the daemon's configuration Struct, its ``AIWG_*``
variable, its :class:`Kind` (how a value parses and which values are accepted), what it needs of
the host, and one line of doc; the default is the Struct's own (a row describes a default the
loader computes, such as one under the state dir). A :class:`SettingsTable` reads its rows from the
environment, and from a TOML table keyed by field name, raising the daemon's error class with a
message that names the variable (or the file key). Checks that relate settings to each other (a
TLS certificate needs its key) stay in the daemon's loader, after the table.

``docs/configuration.md`` is rendered from the same rows (:func:`render_markdown`; ``make docs``
runs ``scripts/gen-config-doc.py``), so the page cannot drift from the code.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from .logformat import LOG_FORMATS, LOG_LEVELS

T = TypeVar("T")

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingError(ValueError):
    """A value does not parse or is out of bounds; the message names the variable or key."""


def number(value: float) -> str:
    """A bound as people write it: ``3600.0`` -> ``3600``, ``0.05`` -> ``0.05``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def split_host_port(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError if it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


# -- kinds ---------------------------------------------------------------------------------------


class Kind(ABC, Generic[T]):
    """How a setting's value parses and which values it accepts."""

    @abstractmethod
    def parse(self, raw: object, source: str) -> T:
        """``raw`` (an env string or a TOML value) as the field's type; SettingError naming ``source``."""

    def accepts(self) -> str:
        """The values accepted, in plain text (messages say it too); "" when any value of the type goes."""
        return ""

    def show(self, value: T) -> str:
        """A value as the doc shows it."""
        return str(value)


def _text(raw: object, source: str) -> str:
    if not isinstance(raw, str):
        raise SettingError(f"{source}={raw!r} must be a string")
    return raw


@dataclass(frozen=True, kw_only=True)
class Int(Kind[int]):
    """An integer at least ``minimum`` (and at most ``maximum``), written in ``base``."""

    minimum: int = 0
    maximum: int | None = None
    base: int = 10

    def parse(self, raw: object, source: str) -> int:
        if isinstance(raw, str):
            try:
                value = int(raw, self.base)
            except ValueError:
                raise SettingError(f"{source}={raw!r} is not an integer") from None
        elif isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():  # TOML's 4096.0
            value = int(raw)
        else:
            raise SettingError(f"{source}={raw!r} is not an integer")
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise SettingError(f"{source}={self.show(value)} must be {self.accepts()}")
        return value

    def accepts(self) -> str:
        if self.maximum is None:
            return f"at least {self.show(self.minimum)}"
        return f"between {self.show(self.minimum)} and {self.show(self.maximum)}"

    def show(self, value: int) -> str:
        return oct(value) if self.base == 8 else str(value)


@dataclass(frozen=True, kw_only=True)
class Float(Kind[float]):
    """A number between ``minimum`` and ``maximum`` (both included)."""

    minimum: float
    maximum: float

    def parse(self, raw: object, source: str) -> float:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise SettingError(f"{source}={raw!r} is not a number")
        try:
            value = float(raw)
        except ValueError:
            raise SettingError(f"{source}={raw!r} is not a number") from None
        if not self.minimum <= value <= self.maximum:  # NaN fails this too
            raise SettingError(f"{source}={number(value)} must be {self.accepts()}")
        return value

    def accepts(self) -> str:
        return f"between {number(self.minimum)} and {number(self.maximum)}"

    def show(self, value: float) -> str:
        return number(value)


@dataclass(frozen=True, kw_only=True)
class Flag(Kind[bool]):
    """On or off: ``1``/``0`` (also true/false, yes/no, on/off); in TOML also a boolean."""

    def parse(self, raw: object, source: str) -> bool:
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower() if isinstance(raw, str | int) else None
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise SettingError(f"{source}={raw!r} must be 1 or 0")

    def accepts(self) -> str:
        return "1 or 0"

    def show(self, value: bool) -> str:
        return "1" if value else "0"


@dataclass(frozen=True, kw_only=True)
class Text(Kind[str]):
    """A string; with ``pattern``, one that matches it whole (or empty), described by ``rule``.

    ``check`` may normalise the value or refuse it with a ValueError saying why.
    """

    pattern: str = ""
    rule: str = ""
    check: Callable[[str], str] | None = None

    def parse(self, raw: object, source: str) -> str:
        value = _text(raw, source)
        if value and self.pattern and not re.fullmatch(self.pattern, value):
            raise SettingError(f"{source}={value!r} must be {self.rule}")
        if value and self.check is not None:
            try:
                value = self.check(value)
            except ValueError as exc:
                raise SettingError(f"{source}={raw!r}: {exc}") from None
        return value

    def accepts(self) -> str:
        return self.rule


@dataclass(frozen=True, kw_only=True)
class AbsPath(Kind[str]):
    """An absolute path (or empty, or one of the words in ``also``), at most ``max_chars`` long."""

    also: tuple[str, ...] = ()
    max_chars: int | None = None

    def parse(self, raw: object, source: str) -> str:
        value = _text(raw, source)
        if value and value not in self.also and not os.path.isabs(value):
            raise SettingError(f"{source}={value!r} must be {self.accepts()}")
        if self.max_chars is not None and len(value) > self.max_chars:
            raise SettingError(f"{source}={value!r} is longer than {self.max_chars} characters")
        return value

    def accepts(self) -> str:
        words = "".join(f" or {word!r}" for word in self.also)
        longest = f", at most {self.max_chars} characters" if self.max_chars is not None else ""
        return f"an absolute path{words}{longest}"


@dataclass(frozen=True, kw_only=True)
class Choice(Kind[str]):
    """One of ``choices``, spelled exactly."""

    choices: tuple[str, ...]

    def parse(self, raw: object, source: str) -> str:
        value = _text(raw, source)
        if value not in self.choices:
            raise SettingError(f"{source}={value!r} must be {self.accepts()}")
        return value

    def accepts(self) -> str:
        return "one of " + ", ".join(self.choices)


@dataclass(frozen=True, kw_only=True)
class Ids(Kind[frozenset[int]]):
    """Numeric ids separated by commas or spaces."""

    def parse(self, raw: object, source: str) -> frozenset[int]:
        try:
            return frozenset(int(item) for item in _text(raw, source).replace(",", " ").split())
        except ValueError:
            raise SettingError(f"{source}={raw!r} must be {self.accepts()}") from None

    def accepts(self) -> str:
        return "a comma-separated list of numeric ids"

    def show(self, value: frozenset[int]) -> str:
        return ",".join(str(item) for item in sorted(value))


@dataclass(frozen=True, kw_only=True)
class HostPort(Kind[str]):
    """``host:port`` (an IPv6 host in brackets); with ``empty_ok``, also "" (none)."""

    empty_ok: bool = False

    def parse(self, raw: object, source: str) -> str:
        value = _text(raw, source)
        if not value and self.empty_ok:
            return value
        try:
            split_host_port(value)
        except ValueError:
            raise SettingError(f"{source}={value!r} must be {self.accepts()}") from None
        return value

    def accepts(self) -> str:
        return "host:port (port 0-65535)" + (", or empty" if self.empty_ok else "")


# -- rows and tables -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Setting(Generic[T]):
    """One setting: the Struct field, its variable, its kind and one line of doc."""

    field: str
    env: str
    kind: Kind[T]
    doc: str
    #: The default as the doc shows it, when the loader computes it (dev mode, under the state
    #: dir); "" = the Struct's own default.
    default: str = ""
    #: What the host must provide for the setting to matter (root, KVM, podman); "" = nothing.
    needs: str = ""
    #: An empty variable is a value (not "unset, keep the default").
    empty_is_value: bool = False


class SettingsTable:
    """The rows of one daemon's configuration Struct, in the order the doc lists them."""

    def __init__(
        self,
        daemon: str,
        struct: type[msgspec.Struct],
        rows: Sequence[Setting[Any]],
        *,
        error: type[Exception] = SettingError,
        unlisted: tuple[str, ...] = (),
    ) -> None:
        """``unlisted``: the Struct's fields that are not settings (``dev``, a flag); every other
        field must have a row, so a new field cannot go without its variable and its doc."""
        self.daemon = daemon
        self.struct = struct
        self.error = error
        self._rows = tuple(rows)
        self._by_field = {row.field: row for row in self._rows}
        self._defaults: dict[str, object] = {}
        for info in msgspec.structs.fields(struct):
            if info.default is not msgspec.NODEFAULT:
                self._defaults[info.name] = info.default
            elif info.default_factory is not msgspec.NODEFAULT:
                self._defaults[info.name] = info.default_factory()
        envs = {row.env for row in self._rows}
        if len(self._by_field) != len(self._rows) or len(envs) != len(self._rows):
            raise ValueError(f"{daemon}: a field or variable is named by two settings")
        for row in self._rows:
            if row.field not in struct.__struct_fields__:
                raise ValueError(f"{daemon}: {row.field!r} is not a field of {struct.__name__}")
            if row.field not in self._defaults and not row.default:
                raise ValueError(f"{daemon}: {row.field!r} has no default in {struct.__name__} and none in its row")
        missing = sorted(set(struct.__struct_fields__) - set(self._by_field) - set(unlisted))
        if missing:
            raise ValueError(f"{daemon}: no setting for the field(s) {', '.join(missing)} of {struct.__name__}")

    def __iter__(self) -> Iterator[Setting[Any]]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, field: str) -> Setting[Any]:
        return self._by_field[field]

    def default_text(self, row: Setting[Any]) -> str:
        """The default as the doc shows it."""
        if row.default:
            return row.default
        value = self._defaults[row.field]
        if value is None:
            return "unset"
        shown = row.kind.show(value) if value != "" else ""
        return f"`{shown}`" if shown else "empty"

    def parse(self, row: Setting[T], raw: object, source: str) -> T:
        """``raw`` by ``row``'s kind; the table's error class naming ``source`` if it does not do."""
        try:
            return row.kind.parse(raw, source)
        except SettingError as exc:
            raise self.error(str(exc)) from None

    def from_env(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The fields whose variables are set (an empty one is unset unless the row says not)."""
        values: dict[str, Any] = {}
        for row in self._rows:
            raw = env.get(row.env)
            if raw is None or (raw == "" and not row.empty_is_value):
                continue
            values[row.field] = self.parse(row, raw, row.env)
        return values

    def from_mapping(self, data: Mapping[str, object], where: str) -> dict[str, Any]:
        """A table keyed by field name, read from the file ``where``: errors name ``<key> (in <where>)``."""
        unknown = sorted(set(data) - set(self._by_field))
        if unknown:
            raise self.error(f"config file {where!r}: unknown key {unknown[0]!r}")
        values: dict[str, Any] = {}
        for key, raw in data.items():
            values[key] = self.parse(self._by_field[key], raw, f"{key} (in {where})")
        return values


# -- the doc -------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(table: SettingsTable, *, keys: bool = False) -> str:
    """One Markdown table of ``table``'s rows; ``keys`` adds the field name (a TOML file's key)."""
    head = ["Variable", *(["File key"] if keys else []), "Default", "Accepted", "Needs", "What it does"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        cells = [
            f"`{row.env}`",
            *([f"`{row.field}`"] if keys else []),
            table.default_text(row),
            row.kind.accepts(),
            row.needs,
            row.doc,
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


# -- the log settings both daemons share -----------------------------------------------------------


class LogSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What :func:`~agentic_sandbox.proto.logformat.configure_logging` reads, first thing at start."""

    format: str = "text"
    level: str = "INFO"


#: For the doc: ``configure_logging`` parses these itself (case-insensitively; ``--log-level`` of
#: ``agentic-hostd`` overrides the level).
LOG_SETTINGS = SettingsTable(
    "agentic-hostd and agentic-controller",
    LogSettings,
    [
        Setting(
            field="format",
            env="AIWG_LOG_FORMAT",
            kind=Choice(choices=LOG_FORMATS),
            doc="`text` (`<time> <LEVEL> <logger>: <message>`, for a terminal) or `json` (one object per line, "
            "with the ids the line concerns, for journald and log shippers).",
        ),
        Setting(
            field="level",
            env="AIWG_LOG_LEVEL",
            kind=Choice(choices=LOG_LEVELS),
            doc="The least severe records written.",
        ),
    ],
)


__all__ = [
    "LOG_SETTINGS",
    "AbsPath",
    "Choice",
    "Flag",
    "Float",
    "HostPort",
    "Ids",
    "Int",
    "Kind",
    "LogSettings",
    "Setting",
    "SettingError",
    "SettingsTable",
    "Text",
    "number",
    "render_markdown",
    "split_host_port",
]
