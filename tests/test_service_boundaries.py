"""No service imports another: the services are separate processes that talk over ZMQ, and
what they share lives in libs/common (switchyard.common) and protos (switchyard.protos).

Every shipped module of a service (in pyproject's packages: tests and tools such as the fuzz
harnesses' runner are not) is parsed, and each of its imports, plain
or relative, inside functions and TYPE_CHECKING blocks too, is resolved to the package it
names; one that names another service fails the test. libs/common and protos import no
service at all. The `switchyard` package itself (the CLI and `up`, which starts every
service) may import them all.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _packages() -> dict[str, Path]:
    """Top-level switchyard packages (switchyard.X) -> their folder, from pyproject."""
    dirs = SETUPTOOLS["package-dir"]
    return {name: ROOT / where for name, where in dirs.items() if name.count(".") == 1}


PACKAGES = _packages()
SHIPPED = set(SETUPTOOLS["packages"])  # every package the wheel holds, subpackages too
SERVICES = {name for name, where in PACKAGES.items() if where.parent.name == "services"}
SHARED = {"switchyard.common", "switchyard.protos"}


def _module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            if _owner(name) is None:  # `from switchyard import router`
                out += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return out


def _owner(name: str) -> str | None:
    """The switchyard package an imported name belongs to (None: not one of ours)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "switchyard":
        return None
    top = ".".join(parts[:2])
    return top if top in PACKAGES else None


def crossings(package: str) -> list[str]:
    """Where `package`'s shipped modules import a service other than itself."""
    found = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        module = _module_name(package, path)
        owner = module if path.name == "__init__.py" else module.rpartition(".")[0]
        if owner not in SHIPPED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, name in _imported(tree, module, path.name == "__init__.py"):
            owner = _owner(name)
            if owner in SERVICES and owner != package:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(found))


def test_the_services_are_found():
    assert {"switchyard.preprocessor", "switchyard.router", "switchyard.dispatcher"} <= SERVICES
    assert {"switchyard.fleet", "switchyard.mock_engine"} <= SERVICES
    assert SHARED <= set(PACKAGES)
    assert "switchyard.preprocessor.stages" in SHIPPED
    assert "switchyard.common.fuzz" not in SHIPPED  # its runner reads a service's regex


def test_no_service_imports_another():
    found = [line for service in sorted(SERVICES) for line in crossings(service)]
    assert not found, "a service imports another (share it through libs/common):\n" + "\n".join(
        found
    )


def test_shared_code_imports_no_service():
    found = [line for package in sorted(SHARED) for line in crossings(package)]
    assert not found, "\n".join(found)


def test_the_check_sees_relative_and_nested_imports():
    source = (
        "from .. import router\n"
        "def f():\n"
        "    from switchyard.dispatcher.service import X\n"
        "    import switchyard.fleet\n"
    )
    names = [n for _, n in _imported(ast.parse(source), "switchyard.preprocessor.app", False)]
    owners = {_owner(n) for n in names} - {None}
    assert owners == {"switchyard.router", "switchyard.dispatcher", "switchyard.fleet"}
