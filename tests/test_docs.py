"""The docs follow the code: the flag reference is what the parsers say, every relative link
and anchor resolves, the README stays short, opens with the two commands and maps every doc.
(Every metric the running services export is in docs/operating.md: test_operability.py.)"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from docs_index import DOCS, ROOT, metrics_message, undocumented_metrics

from switchyard import cli
from switchyard.mock_engine.metrics import engine_registry

README = ROOT / "README.md"
FLAGS = DOCS / "flags.md"
README_LIMIT = 8 * 1024


def _generator():
    path = ROOT / "tools" / "gen_config_docs.py"
    spec = importlib.util.spec_from_file_location("gen_config_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_files() -> list[Path]:
    """The repository's own Markdown files (not what a venv or a build put in the tree)."""
    skip = {".venv", ".venv-tools", "build", "node_modules", ".git"}
    return sorted(
        p
        for p in ROOT.rglob("*.md")
        if not skip & set(p.relative_to(ROOT).parts) and not p.name.startswith(".")
    )


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a link is only text."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text()))


_DOC_REF = re.compile(r"docs/([a-z0-9-]+\.md)(?:'s)?(?:,\s+\"([^\"]{1,80})\")?")


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", " ".join(heading.lower().split())).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes; a repeated
    heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^(```|~~~).*?^\1", "", path.read_text(), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


class TestFlagReference:
    def test_committed_file_is_current(self):
        diff = _generator().stale()
        assert not diff, (
            "docs/flags.md does not match the commands' parsers: run `make docs` "
            "(.venv/bin/python tools/gen_config_docs.py) and commit docs/flags.md.\n" + diff
        )

    @pytest.mark.parametrize("command", list(cli.SUBCOMMANDS))
    def test_every_flag_of_every_command_is_in_it(self, command):
        text = FLAGS.read_text()
        start = text.index(f"## `switchyard {command}`")
        end = text.find("\n## ", start + 1)
        section = text[start : end if end > 0 else len(text)]
        parser = cli.command_parser(command)
        missing = [
            flag
            for action in parser._actions
            if not isinstance(action, argparse._HelpAction)
            for flag in action.option_strings
            # a flag and its --no- form are listed together: `--x, --no-x`
            if not re.search(rf"(`|`--\S+, ){re.escape(flag)}[ `,]", section)
        ]
        assert not missing, (
            f"`switchyard {command}` flags missing from docs/flags.md: {missing}: run `make "
            "docs` and commit docs/flags.md"
        )

    def test_the_check_mode_fails_on_a_stale_file(self, tmp_path):
        stale = tmp_path / "flags.md"
        stale.write_text(FLAGS.read_text().replace("--worker", "--wroker"))
        gen = _generator()
        gen.ROOT = tmp_path
        assert gen.stale(stale)


class TestLinks:
    def test_every_relative_link_and_anchor_resolves(self):
        broken = []
        for path in markdown_files():
            for target in links(path):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                where = f"{path.relative_to(ROOT)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading with anchor #{anchor}")
        assert not broken, "broken links in the docs:\n" + "\n".join(broken)

    def test_code_that_names_a_doc_names_one_that_exists(self):
        """Docstrings, comments and help text point at docs as `docs/NAME.md` (optionally
        `docs/NAME.md, "Heading"`): the file and the heading exist."""
        broken = []
        for path in sorted(ROOT.glob("*/**/*.py")):
            if {".venv", ".venv-tools", "build"} & set(path.relative_to(ROOT).parts):
                continue
            for file, heading in _DOC_REF.findall(path.read_text()):
                doc = DOCS / file
                where = f"{path.relative_to(ROOT)}: docs/{file}"
                if not doc.exists():
                    broken.append(f"{where}: no such file")
                elif heading and _slug(heading) not in anchors(doc):
                    broken.append(f'{where}, "{heading}": no such heading')
        assert not broken, "code points at docs that are not there:\n" + "\n".join(broken)

    def test_the_anchor_rule_matches_githubs(self, tmp_path):
        doc = tmp_path / "a.md"
        doc.write_text(
            "# Top\n## `switchyard mock-engine`\n## KV events: bind, connect\n"
            "## When Switchyard's own processes fail\n## Top\n```\n# not a heading\n```\n"
        )
        assert anchors(doc) == {
            "top",
            "switchyard-mock-engine",
            "kv-events-bind-connect",
            "when-switchyards-own-processes-fail",
            "top-1",
        }

    def test_links_in_code_are_not_links(self, tmp_path):
        doc = tmp_path / "a.md"
        doc.write_text("[a](b.md) `[c](d.md)`\n```\n[e](f.md)\n```\n")
        assert links(doc) == ["b.md"]


class TestReadme:
    def test_short(self):
        size = len(README.read_bytes())
        assert size <= README_LIMIT, (
            f"README.md is {size} bytes, over {README_LIMIT}: move detail into the topic's "
            "doc under docs/ and link it"
        )

    def test_opens_with_the_two_commands(self):
        opening = "\n".join(README.read_text().splitlines()[:40])
        assert "make run" in opening and "make test" in opening

    def test_maps_every_doc(self):
        linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
        unmapped = [
            str(p.relative_to(ROOT)) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked
        ]
        assert not unmapped, (
            f"docs not linked from README.md's documentation table: {unmapped}: add a row "
            "for each to the table under '## Documentation'"
        )


class TestMetrics:
    def test_the_mock_engines_metrics_are_documented(self):
        engine = SimpleNamespace(total_requests=0, aborts=0, tokens_generated=0, active_requests=0)
        names = {family.name for family in engine_registry(engine).collect()}  # type: ignore[arg-type]
        assert names
        missing = undocumented_metrics(names)
        assert not missing, metrics_message(missing, "the mock engine")
