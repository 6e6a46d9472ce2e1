"""pyproject.toml declares what the code imports, as ranges; the lock files hold the pins.

- every third-party module the shipped packages import comes from a declared runtime
  dependency, and every one the tests import from a runtime or dev dependency;
- every declared dependency is a range with an upper bound, not an exact pin (`==`): the lock
  files pin exact versions (`make lock`), pyproject says what Switchyard is compatible with;
- the test support (tests/support) is not part of the shipped packages.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SHIPPED = ("libs", "services", "switchyard", "protos")
# The tests' own modules and packages (tests/ is on pytest's `pythonpath`; some suites put
# their own folder on sys.path too).
LOCAL = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {
    p.name for p in (ROOT / "tests").rglob("*") if p.is_dir()
}


_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    match = _REQUIREMENT.match(requirement)
    assert match, requirement
    return _normalize(match[1])


def _operators(requirement: str) -> set[str]:
    match = _REQUIREMENT.match(requirement)
    assert match, requirement
    operators = set()
    for part in match[2].split(","):
        if part.strip():
            op = re.match(r"\s*(===|==|~=|!=|<=|>=|<|>)", part)
            assert op, requirement
            operators.add(op[1])
    return operators


def _declared(*extras: str) -> set[str]:
    project = PYPROJECT["project"]
    found = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        found |= {_name(r) for r in project["optional-dependencies"][extra]}
    return found


def _is_test(path: Path) -> bool:
    return "tests" in path.relative_to(ROOT).parts


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports outside `try: ... except ImportError`."""
    tree = ast.parse(path.read_text())
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _own_venv(path: Path) -> bool:
    """In a folder with its own requirements.lock: a suite whose code also runs in a venv of
    its own (tests/real_engines: the vLLM engine), which that lock governs."""
    return any(
        (folder / "requirements.lock").exists()
        for folder in path.parents
        if folder != ROOT and ROOT in folder.parents
    )


def _python_files(test: bool) -> list[Path]:
    """The Python files of the shipped packages (or their tests); not vendored third-party
    code kept as test fixtures (a `vendor` folder), nor suites with a venv of their own."""
    roots = [ROOT / r for r in SHIPPED] + ([ROOT / "tests"] if test else [])
    return sorted(
        p
        for r in roots
        for p in r.rglob("*.py")
        if _is_test(p) == test and "vendor" not in p.relative_to(ROOT).parts and not _own_venv(p)
    )


def _undeclared(paths: list[Path], declared: set[str]) -> list[str]:
    distributions = metadata.packages_distributions()
    missing: dict[str, str] = {}
    for path in paths:
        for module in sorted(_imports(path)):
            if module in sys.stdlib_module_names or module in ("switchyard", *LOCAL):
                continue
            # A module that is not installed is taken for the distribution of its own name.
            dists = {_normalize(d) for d in distributions.get(module, [module])}
            if not dists & declared and module not in missing:
                missing[module] = f"{module} ({path.relative_to(ROOT)}; from {sorted(dists)})"
    return sorted(missing.values())


class TestDeclared:
    def test_what_the_shipped_packages_import(self):
        missing = _undeclared(_python_files(test=False), _declared())
        assert not missing, (
            f"imported by shipped code but not in [project].dependencies: {missing}. Add each "
            "to pyproject.toml as a range (>=LOCKED,<NEXT_MAJOR) and run `make lock`."
        )

    def test_what_the_tests_import(self):
        missing = _undeclared(_python_files(test=True), _declared("dev"))
        assert not missing, (
            f"imported by tests but not declared: {missing}. Add each to pyproject.toml's "
            "dev extra as a range (>=LOCKED,<NEXT_MAJOR) and run `make lock`."
        )

    def test_an_optional_import_is_not_required(self, tmp_path):
        module = tmp_path / "m.py"
        module.write_text("import yaml\ntry:\n    import tqdm\nexcept ImportError:\n    pass\n")
        assert _imports(module) == {"yaml"}


@pytest.mark.parametrize("group", ["dependencies", "dev", "bench"])
def test_ranges_not_pins(group):
    project = PYPROJECT["project"]
    listed = project[group] if group == "dependencies" else project["optional-dependencies"][group]
    bad = []
    for text in listed:
        specs = _operators(text)
        if "==" in specs or "===" in specs or not specs & {"<", "~="}:
            bad.append(text)
    assert not bad, (
        f"{group}: {bad} should be a compatible range with an upper bound, e.g. "
        "'name>=1.4.2,<2' (for a 0.x package '<0.NEXT'); the exact version lives in the lock "
        "files (`make lock`)"
    )


def test_test_support_is_not_shipped():
    packages = PYPROJECT["tool"]["setuptools"]["packages"]
    dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert not [p for p in packages if "test" in p.split(".")[-1]]
    assert not [d for d in dirs.values() if d.startswith("tests")]
