#!/usr/bin/env python3
"""Build the web console into ``src/agentic_sandbox/controller/console/build/`` (served at ``/console/``).

1. Installs the npm packages pinned by ``console/package-lock.json`` (``npm ci --ignore-scripts``:
   exactly the locked versions and integrity hashes, no install scripts) unless
   ``console/node_modules`` already holds exactly them.
2. Copies the console's own files (``console/src/``) and, under ``vendor/``, the parts of xterm.js
   and its fit addon the page loads (their ES modules and stylesheet) with their licences, into a
   fresh folder beside the build, writes ``manifest.json`` (the files, the package versions), and
   swaps it in with a rename: a controller starting meanwhile reads the old build or the new one.

Idempotent and quick once the packages are installed; ``make run``, ``make test`` and ``make console``
run it when a source changed. It needs Node's ``npm`` only when the packages are not installed
yet (``scripts/install-system-deps.sh`` installs Debian's ``nodejs`` and ``npm`` where missing).
Standard library only: it runs with the system python3, before the venv exists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "console"
OUT = ROOT / "src" / "agentic_sandbox" / "controller" / "console" / "build"
NONCE_MARK = "__CSP_NONCE__"
#: What the console serves of its own sources (anything else in src/ is a mistake, and said so).
SOURCE_SUFFIXES = {".html", ".js", ".css", ".svg"}
#: npm package -> (file in the package, name in the build).
VENDOR = {
    "@xterm/xterm": [
        ("lib/xterm.mjs", "vendor/xterm.mjs"),
        ("css/xterm.css", "vendor/xterm.css"),
        ("LICENSE", "vendor/xterm.LICENSE.txt"),
    ],
    "@xterm/addon-fit": [
        ("lib/addon-fit.mjs", "vendor/addon-fit.mjs"),
        ("LICENSE", "vendor/addon-fit.LICENSE.txt"),
    ],
}


def fail(message: str) -> None:
    print(f"build-console: {message}", file=sys.stderr)
    sys.exit(1)


def locked_versions() -> dict[str, str]:
    lock = json.loads((SOURCE / "package-lock.json").read_text())
    return {
        path.removeprefix("node_modules/"): entry["version"]
        for path, entry in lock["packages"].items()
        if path.startswith("node_modules/")
    }


def installed_versions() -> dict[str, str]:
    found = {}
    for name in locked_versions():
        try:
            found[name] = json.loads((SOURCE / "node_modules" / name / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            pass
    return found


def install_packages() -> None:
    if installed_versions() == locked_versions():
        return
    npm = shutil.which("npm")
    if npm is None:
        fail("npm is missing: run scripts/install-system-deps.sh (Debian's nodejs and npm)")
    command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
    print(f"build-console: {' '.join(command[1:])} in {SOURCE}", file=sys.stderr)
    if subprocess.run(command, cwd=SOURCE, stdin=subprocess.DEVNULL, check=False).returncode != 0:
        fail("npm ci failed (see above)")
    if installed_versions() != locked_versions():
        fail(f"node_modules does not hold what package-lock.json pins: {installed_versions()} != {locked_versions()}")


def build(into: Path) -> list[str]:
    files: list[str] = []
    for path in sorted((SOURCE / "src").iterdir()):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            fail(f"{path} is not a file of a kind the console serves ({', '.join(sorted(SOURCE_SUFFIXES))})")
        shutil.copyfile(path, into / path.name)
        files.append(path.name)
    if (into / "index.html").read_text().count(NONCE_MARK) != 1:
        fail(f"console/src/index.html must hold {NONCE_MARK} exactly once (the style nonce)")
    (into / "vendor").mkdir()
    for package, parts in VENDOR.items():
        for inside, name in parts:
            shutil.copyfile(SOURCE / "node_modules" / package / inside, into / name)
            files.append(name)
    packages = {name: version for name, version in installed_versions().items() if name in VENDOR}
    (into / "manifest.json").write_text(json.dumps({"files": files, "packages": packages}, indent=2) + "\n")
    return files


def main() -> int:
    install_packages()
    fresh = OUT.with_name(OUT.name + ".new")
    stale = OUT.with_name(OUT.name + ".old")
    for leftover in (fresh, stale):
        shutil.rmtree(leftover, ignore_errors=True)
    fresh.mkdir(parents=True)
    files = build(fresh)
    if OUT.exists():
        OUT.rename(stale)
    fresh.rename(OUT)
    shutil.rmtree(stale, ignore_errors=True)
    print(f"build-console: {len(files)} files in {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
