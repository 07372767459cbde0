"""The settings mechanism: rows parse, bound and default; a bad value's message names its variable."""

from __future__ import annotations

import importlib.util
import io
import logging
from pathlib import Path

import msgspec
import pytest

from agentic_sandbox.proto import configure_logging
from agentic_sandbox.proto.logformat import LOG_FORMATS, LOG_LEVELS
from agentic_sandbox.proto.settings import (
    LOG_SETTINGS,
    AbsPath,
    Choice,
    Flag,
    Float,
    HostPort,
    Ids,
    Int,
    Setting,
    SettingError,
    SettingsTable,
    Text,
    render_markdown,
)

from .test_logformat import root_logger  # noqa: F401 - the fixture


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    count: int = 8
    ratio: float = 0.5
    on: bool = False
    mode: int = 0o640
    uri: str = "a://x"
    ids: frozenset[int] = frozenset()
    kind: str = "one"
    path: str = ""
    listen: str | None = None


class SampleError(ValueError):
    pass


TABLE = SettingsTable(
    "sampled",
    Sample,
    [
        Setting(field="name", env="T_NAME", kind=Text(), default="`<derived>`", doc="A name."),
        Setting(field="count", env="T_COUNT", kind=Int(minimum=2, maximum=100), doc="A count."),
        Setting(field="ratio", env="T_RATIO", kind=Float(minimum=0, maximum=1), doc="A ratio | with a pipe."),
        Setting(field="on", env="T_ON", kind=Flag(), doc="A switch.", needs="root"),
        Setting(field="mode", env="T_MODE", kind=Int(maximum=0o777, base=8), doc="A mode."),
        Setting(
            field="uri",
            env="T_URI",
            kind=Text(pattern=r"[ab]://\S*", rule="an a:// or b:// URI, or empty"),
            empty_is_value=True,
            doc="A URI.",
        ),
        Setting(field="ids", env="T_IDS", kind=Ids(), doc="Ids."),
        Setting(field="kind", env="T_KIND", kind=Choice(choices=("one", "two")), doc="A choice."),
        Setting(field="path", env="T_PATH", kind=AbsPath(also=("off",), max_chars=12), doc="A path."),
        Setting(field="listen", env="T_LISTEN", kind=HostPort(), doc="Where."),
    ],
    error=SampleError,
)


def test_unset_and_empty_variables_keep_the_default() -> None:
    assert TABLE.from_env({}) == {}
    # Empty is "unset" unless the row says an empty value means something.
    assert TABLE.from_env({"T_COUNT": "", "T_ON": "", "T_URI": ""}) == {"uri": ""}


def test_values_parse_to_the_field_types() -> None:
    values = TABLE.from_env(
        {
            "T_NAME": "n",
            "T_COUNT": "42",
            "T_RATIO": "0.25",
            "T_ON": " Yes ",
            "T_MODE": "660",
            "T_URI": "b://host",
            "T_IDS": "1000, 1001 7",
            "T_KIND": "two",
            "T_PATH": "off",
            "T_LISTEN": "[::1]:8080",
        }
    )
    assert values == {
        "name": "n",
        "count": 42,
        "ratio": 0.25,
        "on": True,
        "mode": 0o660,
        "uri": "b://host",
        "ids": frozenset({7, 1000, 1001}),
        "kind": "two",
        "path": "off",
        "listen": "[::1]:8080",
    }
    assert Sample(**values) == Sample(**values)  # every value has the Struct field's type
    assert TABLE.from_env({"T_ON": "off"}) == {"on": False}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"T_COUNT": "ten"}, "T_COUNT='ten' is not an integer"),
        ({"T_COUNT": "1"}, "T_COUNT=1 must be between 2 and 100"),
        ({"T_COUNT": "101"}, "T_COUNT=101 must be between 2 and 100"),
        ({"T_RATIO": "half"}, "T_RATIO='half' is not a number"),
        ({"T_RATIO": "1.5"}, "T_RATIO=1.5 must be between 0 and 1"),
        ({"T_RATIO": "nan"}, "T_RATIO=nan must be between 0 and 1"),
        ({"T_ON": "maybe"}, "T_ON='maybe' must be 1 or 0"),
        ({"T_MODE": "9"}, "T_MODE='9' is not an integer"),
        ({"T_MODE": "1777"}, "T_MODE=0o1777 must be between 0o0 and 0o777"),
        ({"T_URI": "c://x"}, "T_URI='c://x' must be an a:// or b:// URI, or empty"),
        ({"T_IDS": "root"}, "T_IDS='root' must be a comma-separated list of numeric ids"),
        ({"T_KIND": "three"}, "T_KIND='three' must be one of one, two"),
        ({"T_PATH": "relative"}, "T_PATH='relative' must be an absolute path or 'off'"),
        ({"T_PATH": "/a/long/path/here"}, "T_PATH='/a/long/path/here' is longer than 12 characters"),
        ({"T_LISTEN": "nonsense"}, "T_LISTEN='nonsense' must be host:port"),
        ({"T_LISTEN": "h:99999"}, "T_LISTEN='h:99999' must be host:port"),
        ({"T_LISTEN": " "}, "T_LISTEN=' ' must be host:port"),
    ],
)
def test_bad_values_raise_the_table_error_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SampleError) as caught:
        TABLE.from_env(env)
    assert str(caught.value).startswith(message)


def test_a_file_table_is_keyed_by_field_and_typed() -> None:
    values = TABLE.from_mapping({"count": 3, "ratio": 1, "on": True, "ids": "5", "listen": "h:1"}, "/etc/s.toml")
    assert values == {"count": 3, "ratio": 1.0, "on": True, "ids": frozenset({5}), "listen": "h:1"}
    # What a TOML writer may mean: an integral float for an integer, 1/0 for a flag.
    assert TABLE.from_mapping({"count": 4.0, "on": 0}, "/etc/s.toml") == {"count": 4, "on": False}
    assert isinstance(values["ratio"], float)
    for data, message in (
        ({"cuont": 3}, "config file '/etc/s.toml': unknown key 'cuont'"),
        ({"count": True}, "count (in /etc/s.toml)=True is not an integer"),
        ({"count": 2.5}, "count (in /etc/s.toml)=2.5 is not an integer"),
        ({"on": 1.0}, "on (in /etc/s.toml)=1.0 must be 1 or 0"),
        ({"ratio": "x"}, "ratio (in /etc/s.toml)='x' is not a number"),
        ({"ratio": [1]}, "ratio (in /etc/s.toml)=[1] is not a number"),
        ({"on": 2}, "on (in /etc/s.toml)=2 must be 1 or 0"),
        ({"name": 5}, "name (in /etc/s.toml)=5 must be a string"),
    ):
        with pytest.raises(
            SampleError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
        ):
            TABLE.from_mapping(data, "/etc/s.toml")


def test_an_optional_host_port_may_be_empty() -> None:
    assert HostPort(empty_ok=True).parse("", "X") == ""
    assert HostPort(empty_ok=True).accepts().endswith("or empty")
    with pytest.raises(SettingError, match="X='' must be host:port"):
        HostPort().parse("", "X")


def test_the_default_error_is_setting_error() -> None:
    others = tuple(set(Sample.__struct_fields__) - {"count"})
    table = SettingsTable("d", Sample, [Setting(field="count", env="T_COUNT", kind=Int(), doc="c")], unlisted=others)
    with pytest.raises(SettingError, match="T_COUNT"):
        table.from_env({"T_COUNT": "x"})


def test_defaults_come_from_the_struct() -> None:
    shown = {row.field: TABLE.default_text(row) for row in TABLE}
    assert shown == {
        "name": "`<derived>`",
        "count": "`8`",
        "ratio": "`0.5`",
        "on": "`0`",
        "mode": "`0o640`",
        "uri": "`a://x`",
        "ids": "empty",
        "kind": "`one`",
        "path": "empty",
        "listen": "unset",
    }


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([Setting(field="nope", env="T_NOPE", kind=Int(), doc="x")], "not a field of Sample"),
        ([Setting(field="name", env="T_NAME", kind=Text(), doc="x")], "has no default"),
        (
            [
                Setting(field="count", env="T_X", kind=Int(), doc="x"),
                Setting(field="ratio", env="T_X", kind=Int(), doc=""),
            ],
            "named by two settings",
        ),
        (
            [Setting(field="count", env="T_COUNT", kind=Int(), doc="x")],
            "no setting for the field.s. ids, kind, listen, mode, name",
        ),
    ],
)
def test_a_table_that_does_not_fit_its_struct_is_refused(rows: list[Setting[int]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SettingsTable("d", Sample, rows)


def test_markdown_has_one_line_per_row() -> None:
    text = render_markdown(TABLE, keys=True)
    lines = text.splitlines()
    assert lines[0] == "| Variable | File key | Default | Accepted | Needs | What it does |"
    assert len(lines) == 2 + len(TABLE)
    assert "| `T_ON` | `on` | `0` | 1 or 0 | root | A switch. |" in lines
    assert r"A ratio \| with a pipe." in text  # a pipe in a doc does not split the cell
    assert "File key" not in render_markdown(TABLE)


@pytest.mark.usefixtures("root_logger")
def test_the_log_rows_agree_with_configure_logging() -> None:
    assert LOG_SETTINGS["format"].kind == Choice(choices=LOG_FORMATS)
    assert LOG_SETTINGS["level"].kind == Choice(choices=LOG_LEVELS)
    # The defaults the doc shows are the ones configure_logging applies.
    fmt = configure_logging({}, stream=io.StringIO())
    assert f"`{fmt}`" == LOG_SETTINGS.default_text(LOG_SETTINGS["format"])
    assert f"`{logging.getLevelName(logging.getLogger().level)}`" == LOG_SETTINGS.default_text(LOG_SETTINGS["level"])


def test_the_configuration_page_is_current() -> None:
    """docs/configuration.md is what scripts/gen-config-doc.py renders from the tables and flags."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "gen-config-doc.py"
    spec = importlib.util.spec_from_file_location("gen_config_doc", script)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    page = generator.PAGE.read_text() if generator.PAGE.exists() else ""
    assert page == generator.render(), f"docs/configuration.md is stale: run {generator.REGENERATE}"


def test_the_page_lists_every_setting_of_both_daemons() -> None:
    from agentic_sandbox.controller.config import SETTINGS as CONTROLLER
    from agentic_sandbox.controller.config import ControllerConfig
    from agentic_sandbox.hostd.config import SETTINGS as HOSTD
    from agentic_sandbox.hostd.config import HostdConfig

    # Every field but ``dev`` (the --dev flag) is a setting with a row.
    assert {row.field for row in HOSTD} == set(HostdConfig.__struct_fields__) - {"dev"}
    assert {row.field for row in CONTROLLER} == set(ControllerConfig.__struct_fields__) - {"dev"}
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for row in [*HOSTD, *CONTROLLER, *LOG_SETTINGS]:
        assert f"`{row.env}`" in page
    for flag in ("--dev", "--socket", "--state-dir", "--log-level", "--config FILE"):
        assert f"`{flag}" in page
