"""The console's built files: what a build holds, and every way a build can be missing or broken."""

from __future__ import annotations

import json
from pathlib import Path

from agentic_sandbox.controller.console.assets import BUILD_DIR, NONCE_MARK, ConsoleAssets
from tests.hostd_process import ROOT


def _build(directory: Path, files: dict[str, bytes], listed: list[str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(body)
    manifest = {"files": listed if listed is not None else list(files), "packages": {"@xterm/xterm": "0"}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_the_build_holds_the_sources_and_the_locked_packages(console_build: Path) -> None:
    assets = ConsoleAssets.load()
    assert assets.missing is None
    for source in (ROOT / "console" / "src").iterdir():
        built = assets.get(source.name)
        assert built is not None and built.body == source.read_bytes(), f"{source.name} is stale in {BUILD_DIR}"
    lock = json.loads((ROOT / "console" / "package-lock.json").read_text())["packages"]
    assert assets.packages == {
        name: lock[f"node_modules/{name}"]["version"] for name in ("@xterm/xterm", "@xterm/addon-fit")
    }
    for vendored in ("vendor/xterm.mjs", "vendor/xterm.css", "vendor/addon-fit.mjs", "vendor/xterm.LICENSE.txt"):
        assert assets.get(vendored) is not None, vendored
    listed = json.loads((console_build / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(console_build).as_posix() for p in console_build.rglob("*") if p.is_file()}
    assert on_disk == {*listed, "manifest.json"}  # nothing stray from an earlier build
    xterm = assets.get("vendor/xterm.mjs")
    assert xterm is not None and xterm.content_type.startswith("text/javascript")
    assert b"export{" in xterm.body  # the ES module build, as npm installed it


def test_the_page_gets_the_nonce_in_its_one_slot(tmp_path: Path) -> None:
    page = b"<script nonce='" + NONCE_MARK + b"'></script>"
    assets = ConsoleAssets.load(_build(tmp_path, {"index.html": page, "app.js": b"1"}))
    assert assets.missing is None
    assert assets.index("n0nce") == b"<script nonce='n0nce'></script>"
    app = assets.get("app.js")
    assert app is not None and app.etag == ConsoleAssets.load(tmp_path).get("app.js").etag  # type: ignore[union-attr]


def test_no_build_says_how_to_make_one(tmp_path: Path) -> None:
    assets = ConsoleAssets.load(tmp_path / "nothing")
    assert assets.missing is not None and "make console" in assets.missing
    assert assets.get("index.html") is None


def test_a_broken_build_is_refused_whole(tmp_path: Path) -> None:
    page = {"index.html": b"<p>" + NONCE_MARK + b"</p>"}
    cases = {
        "escape": (page, ["index.html", "../secret.txt"]),
        "absolute": (page, ["index.html", "/etc/passwd.txt"]),
        "type": ({**page, "run.sh": b"x"}, None),
        "unlisted file missing": (page, ["index.html", "gone.js"]),
        "no nonce slot": ({"index.html": b"<p></p>"}, None),
        "two nonce slots": ({"index.html": NONCE_MARK * 2}, None),
    }
    for name, (files, listed) in cases.items():
        assets = ConsoleAssets.load(_build(tmp_path / name.replace(" ", "-"), files, listed))
        assert assets.missing is not None and "broken" in assets.missing, name
        assert assets.get("index.html") is None, name
    (tmp_path / "bad-json").mkdir()
    (tmp_path / "bad-json" / "manifest.json").write_text("{")
    assert "broken" in (ConsoleAssets.load(tmp_path / "bad-json").missing or "")
