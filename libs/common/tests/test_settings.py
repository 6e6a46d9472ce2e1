"""The config layer: flag > SWITCHYARD_<FLAG> > config file > default, checked like flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from switchyard.common import settings
from switchyard.common.settings import ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="svc", allow_abbrev=False)
    p.add_argument("--timeout", type=float, default=5.0, help="t")
    p.add_argument("--mode", choices=("kv", "random"), default="kv", help="m")
    p.add_argument("--name", default="x", help="n")
    p.add_argument("--worker", action="append", default=[], help="w")
    p.add_argument("--fast", action="store_true", help="f")
    p.add_argument("--port", type=int, required=True, help="p")
    return p


def resolve(argv, env=None, section=None):
    data = {"svc": section} if section is not None else {}
    return settings.resolve(
        "svc", parser(), argv, environ=env or {}, file_data=data, file_path="c.yaml"
    )


class TestPrecedence:
    def test_flag_beats_env_beats_file_beats_default(self):
        section = {"timeout": 1, "mode": "random", "name": "file", "port": 1}
        env = {"SWITCHYARD_TIMEOUT": "2", "SWITCHYARD_NAME": "env"}
        args, got = resolve(["--timeout", "3"], env, section)
        assert (args.timeout, args.name, args.mode, args.port) == (3.0, "env", "random", 1)
        sources = {k: s.source for k, s in got.items.items()}
        assert sources["timeout"] == "flag"
        assert sources["name"] == "env"
        assert sources["mode"] == "file"
        assert sources["worker"] == "default"
        assert got["timeout"] == 3.0

    def test_required_flag_may_come_from_the_file(self):
        args, _ = resolve([], section={"port": 9})
        assert args.port == 9

    def test_repeatable_flags_replace_what_lower_layers_said(self):
        section = {"worker": ["a", "b"], "port": 1}
        assert resolve([], section=section)[0].worker == ["a", "b"]
        assert resolve(["--worker", "c"], section=section)[0].worker == ["c"]
        env = {"SWITCHYARD_WORKER": "d, e"}
        assert resolve([], env, section)[0].worker == ["d", "e"]

    def test_switches(self):
        assert resolve([], section={"fast": True, "port": 1})[0].fast is True
        assert resolve([], {"SWITCHYARD_FAST": "off"}, {"fast": True, "port": 1})[0].fast is False
        assert resolve(["--fast"], section={"fast": False, "port": 1})[0].fast is True


class TestErrorsNameTheKey:
    @pytest.mark.parametrize(
        ("section", "needle"),
        [
            ({"timeout": "soon"}, "c.yaml: svc.timeout: expected a number, got 'soon'"),
            ({"mode": "best"}, "svc.mode: 'best' is not one of kv, random"),
            ({"fast": "maybe"}, "svc.fast: expected true or false"),
            ({"name": ["a", {"b": 1}]}, "svc.name"),
            ({"worker": [["x"]]}, "svc.worker[0]: expected a string"),
            (
                {"timout": 1},
                "svc.timout: no such flag of `switchyard svc` (did you mean 'timeout'?)",
            ),
        ],
    )
    def test_file_values(self, section, needle):
        with pytest.raises(ConfigError) as caught:
            resolve(["--port", "1"], section=section)
        assert needle in str(caught.value)

    def test_environment_values(self):
        with pytest.raises(ConfigError, match="environment variable SWITCHYARD_TIMEOUT"):
            resolve(["--port", "1"], {"SWITCHYARD_TIMEOUT": "x"})

    def test_sections_and_files(self, tmp_path: Path):
        with pytest.raises(ConfigError, match="unknown section 'routr'.*did you mean 'router'"):
            settings.check_sections({"routr": {}}, ["router"], "c.yaml")
        with pytest.raises(ConfigError, match="section 'router' must be a mapping"):
            settings.check_sections({"router": [1]}, ["router"], "c.yaml")
        bad = tmp_path / "bad.yaml"
        bad.write_text("router: [unclosed")
        with pytest.raises(ConfigError, match="not valid YAML"):
            settings.load_file(bad)
        with pytest.raises(ConfigError, match="missing.yaml"):
            settings.load_file(tmp_path / "missing.yaml")
        bad.write_text("- a list")
        with pytest.raises(ConfigError, match="expected a mapping"):
            settings.load_file(bad)


class TestRender:
    def test_the_output_reads_back_as_the_same_settings(self, tmp_path: Path):
        section = {"timeout": 1.5, "worker": ["a"], "fast": True, "port": 7}
        _, first = resolve([], section=section)
        text = settings.render([first])
        assert "timeout: 1.5  # file c.yaml: svc.timeout" in text
        again = yaml.safe_load(text)
        _, second = resolve([], section=again["svc"])
        assert {k: s.value for k, s in first.items.items()} == {
            k: s.value for k, s in second.items.items()
        }

    def test_settings_are_frozen(self):
        _, got = resolve(["--port", "1"])
        with pytest.raises(AttributeError):
            got.command = "other"  # type: ignore[misc]
        with pytest.raises(TypeError):
            got.items["port"] = None  # type: ignore[index]
