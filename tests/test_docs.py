"""The README and docs/ stay true to the tree: every file path they name exists, every relative link
resolves, and the README stays a way in (about 150 lines at most)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Paths of the project's own files as the pages write them.
NAMED_PATH = re.compile(r"(?<![/\w])((?:src/agentic_sandbox|tests|scripts|systemd|bench|console)/[\w./-]*\w)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_named_path_exists() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in sorted(set(NAMED_PATH.findall(page.read_text())))
        if not (ROOT / path).exists() and "*" not in path
    ]
    assert not missing, "\n".join(missing)


def test_relative_links_resolve() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_way_in() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
