"""Tests mirror modules: a maintainer finds a module's tests by its path.

Every module of ``src/agentic_sandbox/`` that holds logic (a function or a class) has
``tests/<package path>/test_<module>.py``, or a line in ``tests/README.md`` that names it and the
tests that cover it (an end-to-end scenario, or a neighbour's test file); every test file such a
line names exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = ROOT / "src" / "agentic_sandbox"
INDEX = ROOT / "tests" / "README.md"
#: ``- `controller/admin/operations.py`: tests/controller/admin/test_instances.py ...``
LINE = re.compile(r"^- `([\w/]+\.py)`(.*)$")
TEST_PATH = re.compile(r"tests/[\w/]+\.py")


def has_logic(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for node in tree.body)


def modules_with_logic() -> list[str]:
    return [
        str(path.relative_to(NAMESPACE))
        for path in sorted(NAMESPACE.rglob("*.py"))
        if path.name != "__init__.py" and has_logic(path)
    ]


def mirrored(module: str) -> Path:
    path = Path(module)
    return ROOT / "tests" / path.parent / f"test_{path.name}"


def index() -> dict[str, list[str]]:
    lines = (LINE.match(line) for line in INDEX.read_text().splitlines())
    return {m.group(1): TEST_PATH.findall(m.group(2)) for m in lines if m is not None}


def test_every_module_with_logic_has_its_tests() -> None:
    listed = index()
    missing = [m for m in modules_with_logic() if not mirrored(m).exists() and m not in listed]
    assert len(modules_with_logic()) > 100  # the check sees the modules at all
    assert not missing, "no tests/<path>/test_<module>.py and no line in tests/README.md for:\n" + "\n".join(missing)


def test_the_index_names_real_modules_and_tests() -> None:
    bad = []
    for module, tests in index().items():
        if not (NAMESPACE / module).exists():
            bad.append(f"{module}: no such module")
        if not tests:
            bad.append(f"{module}: names no test file")
        bad += [f"{module}: {test} does not exist" for test in tests if not (ROOT / test).exists()]
    assert not bad, "\n".join(bad)
