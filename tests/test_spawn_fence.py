"""Only the fenced modules may fork, exec or open PTYs, only hostd imports podman (STYLE.md: fence the
dangerous code), and each package imports only the packages below it."""

from __future__ import annotations

import ast
from pathlib import Path

from agentic_sandbox import proto
from agentic_sandbox.hostd import SPAWNING_MODULES

ROOT = Path(__file__).resolve().parent.parent
#: Where the import namespace's source lives: module names are ``agentic_sandbox.`` plus the path below it.
SRC = ROOT / "src"
NAMESPACE = SRC / "agentic_sandbox"
PACKAGES = ("proto", "hostd", "controller", "cli")
#: What each package may import of ours besides itself: proto is the only thing they share.
MAY_IMPORT = {"proto": set(), "hostd": {"proto"}, "controller": {"proto"}, "cli": {"proto"}}

FORBIDDEN_MODULES = {"subprocess", "pty", "ptyprocess", "multiprocessing", "pexpect"}
FORBIDDEN_OS = ("fork", "forkpty", "exec", "spawn", "posix_spawn", "system", "popen", "openpty")
FORBIDDEN_TRIO = {"run_process", "open_process"}


def offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # Only absolute imports can name the stdlib: ``from .pty import ...`` is controller.pty.
            if node.level == 0 and node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"from {node.module} import ...")
            if node.module == "os":
                found += [f"from os import {a.name}" for a in node.names if a.name.startswith(FORBIDDEN_OS)]
        elif isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "os" and node.attr.startswith(FORBIDDEN_OS):
                found.append(f"os.{node.attr}")
            if node.attr in FORBIDDEN_TRIO:
                found.append(f"...{node.attr}")
    return [f"{module_name(path)}:{item}" for item in found]


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_dir(package: str) -> Path:
    return NAMESPACE / package


def test_only_fenced_modules_spawn() -> None:
    bad = []
    checked = 0
    for package in PACKAGES:
        for path in sorted(package_dir(package).rglob("*.py")):
            checked += 1
            if module_name(path) in SPAWNING_MODULES:
                continue
            bad += offences(path)
    assert checked > 10
    assert not bad, "process creation outside the fenced modules:\n" + "\n".join(bad)


def test_fenced_modules_exist_and_do_spawn() -> None:
    for name in SPAWNING_MODULES:
        path = SRC / (name.replace(".", "/") + ".py")
        assert path.exists(), name
        assert offences(path), f"{name} is fenced but spawns nothing: drop it from SPAWNING_MODULES"


def absolute_imports(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth of its code), relative imports resolved."""
    found: set[str] = set()
    own = module_name(path).split(".") if path.is_relative_to(SRC) else []
    if path.name != "__init__.py":
        own = own[:-1]  # a module's relative imports start from its package
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = own[: len(own) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}  # `from agentic_sandbox import proto`
    return found


def imports_of(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports."""
    return {name.split(".")[0] for name in absolute_imports(path)}


def our_imports(path: Path) -> set[str]:
    """The packages of ours (from PACKAGES) that a module imports, relative imports included."""
    return {
        name.split(".")[1]
        for name in absolute_imports(path)
        if name.startswith("agentic_sandbox.") and name.split(".")[1] in PACKAGES
    }


def test_packages_import_only_proto() -> None:
    bad = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted(package_dir(package).rglob("*.py")):
            bad += [f"{module_name(path)} imports {name}" for name in our_imports(path) - allowed - {package}]
    assert our_imports(package_dir("cli") / "hostctl.py") == {"cli", "proto"}  # the check sees imports at all
    assert not bad, "\n".join(bad)


def test_only_hostd_talks_to_podman() -> None:
    """DESIGN.md §2: only hostd talks to podman; the controller asks hostd (ImageListRequest)."""
    importers = sorted(
        str(path.relative_to(NAMESPACE))
        for package in PACKAGES
        for path in package_dir(package).rglob("*.py")
        if "podman" in imports_of(path)
    )
    assert importers, "nothing imports podman: the image catalog moved, update this test"
    assert all(name.startswith("hostd/") for name in importers), importers


def test_only_hostd_talks_to_libvirt() -> None:
    """DESIGN.md §2: only hostd talks to libvirt (the VM provider and its console/exec helpers)."""
    importers = sorted(
        str(path.relative_to(NAMESPACE))
        for package in PACKAGES
        for path in package_dir(package).rglob("*.py")
        if imports_of(path) & {"libvirt", "libvirt_qemu"}
    )
    assert "hostd/providers/libvirt/connection.py" in importers, importers
    assert all(name.startswith("hostd/") for name in importers), importers


def test_proto_exports_are_pinned() -> None:
    assert sorted(proto.__all__) == sorted(
        [
            "DEFAULT_MAX_FRAME_BYTES",
            "DEV_STATE_DIR",
            "PROD_HOSTD_SOCKET",
            "PROTOCOL_VERSION",
            "ErrorCode",
            "EventStream",
            "FrameBuffer",
            "FrameEncoder",
            "FrameInvalid",
            "FrameTooLarge",
            "HostdClient",
            "HostdConnectionLost",
            "HostdError",
            "HostdNotRunning",
            "HostdProtocolError",
            "HostdRemoteError",
            "HostdRestarting",
            "HostdStreamOverflow",
            "HostdTimeout",
            "HostdUnavailable",
            "HostdVersionMismatch",
            "Limit",
            "LogConfigError",
            "UnknownFrame",
            "dev_hostd_socket",
            "find_hostd_socket",
            "bind_log_ids",
            "configure_logging",
            "current_log_ids",
            "is_uuid",
            "log_context",
            "logs_as_json",
            "messages",
            "new_id",
            "open_hostd",
            "settings",
            "uuid7",
        ]
    )
    for name in proto.__all__:
        assert hasattr(proto, name)
