"""The controller's layout holds: no import cycle, and services know no HTTP.

Surfaces (the route modules, the HTTP edge, the app) may import services; services (everything
else: the catalog, tasks, push, store, events, the A2A service layer...) never import a web
framework, the app state or a surface. Imports are read from the source (relative ones resolved,
``TYPE_CHECKING`` ones included: a cycle of type names is a cycle of modules too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CONTROLLER = SRC / "agentic_sandbox" / "controller"
PREFIX = "agentic_sandbox.controller"

#: The web framework and server (an HTTP *client*, such as push delivery's h11, is a service's business).
HTTP_PACKAGES = {"quart", "quart_trio", "werkzeug", "hypercorn"}
#: The surfaces and the HTTP edge: modules that may touch a request (names below the controller).
SURFACE = (
    "__init__",
    "app",
    "main",
    "state",
    "v1",
    "observability",
    "hosts.router",
    "http.",
    "admin.",
    "console.",
    "a2a.blueprint",
    "a2a.surface",
    "a2a.rest",
    "a2a.rest03",
    "a2a.jsonrpc",
    "a2a.rpcframing",
    "a2a.rpc03",
    "a2a.grpcbinding",
    "a2a.discovery",
    "a2a.edge",
    "a2a.idempotency",
    "a2a.sse",
    "a2a.v1hitl",
    "fleet.routes",
    "pty.blueprint",
    "pty.surface",
    "pty.route",
    "pty.legacy",
    "pty.asgisocket",
    "pty.attach",
)


def name_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {name_of(p): p for p in sorted(CONTROLLER.rglob("*.py"))}


def short(module: str) -> str:
    """``agentic_sandbox.controller.a2a`` -> ``a2a.__init__`` (packages named by their init)."""
    if module == PREFIX:
        return "__init__"
    rest = module[len(PREFIX) + 1 :]
    return rest + ".__init__" if MODULES[module].name == "__init__.py" else rest


def is_surface(module: str) -> bool:
    name = short(module)
    return any(name == s or (s.endswith(".") and name.startswith(s)) for s in SURFACE)


def imports(module: str, *, inits: bool = False) -> set[str]:
    """Every module of ours ``module`` imports, and every outside top-level package; with ``inits``,
    the packages whose ``__init__`` those imports run first too."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            target = ".".join(filter(None, [base, node.module or ""]))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)  # `from . import rest`: the submodule
    ours = {m for m in found if m in MODULES}
    for m in list(ours) if inits else ():
        parts = m.split(".")
        ours |= {".".join(parts[:i]) for i in range(3, len(parts))} & set(MODULES)
    return ours - {module} | {m.split(".")[0] for m in found if not m.startswith("agentic_sandbox")}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: imports(m) & set(MODULES) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(short(w))
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle() -> None:
    """(A package's init that re-exports its modules, its flat public face, is no cycle: Python runs
    the init first, which imports the modules, which import each other.)"""
    assert cycles() == []


def test_services_know_no_http() -> None:
    bad = []
    services = [m for m in MODULES if not is_surface(m)]
    for module in services:
        # Importing a module runs its packages' inits first: a surface package's init that builds
        # the blueprint would pull the web framework into every service beside it.
        for name in imports(module, inits=True):
            if name in HTTP_PACKAGES or (name.startswith(PREFIX) and is_surface(name)):
                bad.append(f"{short(module)} imports {name}")
    assert len(services) > 50  # the check sees the services at all
    assert not bad, "\n".join(bad)
