"""The `switchyard` command: help for every flag, --version, lazy imports, config print."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from switchyard import cli


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    return {name: cli.command_parser(name) for name in cli.SUBCOMMANDS}


def missing_help(parser: argparse.ArgumentParser) -> list[str]:
    """Flags of `parser` without help text."""
    return [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip())
    ]


class TestHelp:
    def test_every_flag_of_every_command_has_help(self):
        missing = {name: missing_help(p) for name, p in command_parsers().items()}
        assert {name: flags for name, flags in missing.items() if flags} == {}

    def test_a_flag_without_help_is_caught(self):
        parser = argparse.ArgumentParser()
        parser.add_argument("--documented", help="says what it does")
        parser.add_argument("--bare")
        assert missing_help(parser) == ["--bare"]

    def test_help_shows_defaults_and_choices(self):
        text = cli.command_parser("router").format_help()
        assert "(default: 600.0)" in " ".join(text.split())  # --request-ttl
        assert (
            "{kv,kv_overlap,round_robin,random,least_loaded,session,consistent_hash}" in text
        )  # --router-mode
        up = " ".join(cli.command_parser("up").format_help().split())
        assert (
            "--router-mode {kv,kv_overlap,round_robin,random,least_loaded,session,consistent_hash}"
            in up
        )
        pre = " ".join(cli.command_parser("preprocessor").format_help().split())
        assert "--log-format {text,json}" in pre
        assert "SWITCHYARD_<FLAG>" in pre

    def test_formatter_adds_hidden_choices_and_no_duplicate_default(self):
        parser = argparse.ArgumentParser(formatter_class=cli.HelpFormatter)
        parser.add_argument("--a", choices=("x", "y"), default="x", metavar="A", help="pick")
        parser.add_argument("--b", type=int, default=2, help="count (default 2)")
        text = " ".join(parser.format_help().split())
        assert "pick (choices: x, y; default: x)" in text
        assert "count (default 2)" in text and "default: 2" not in text


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "switchyard", *argv],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
    )


class TestVersion:
    @pytest.mark.parametrize("command", [None, *cli.SUBCOMMANDS])
    def test_every_command_prints_the_version(self, command):
        argv = [command, "--version"] if command else ["--version"]
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 0


class TestLazyImports:
    def test_a_service_imports_only_its_own_module(self):
        code = (
            "import sys\n"
            "from switchyard.cli import main\n"
            "try:\n    main(['router', '--version'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'tokenizers', "
            "'switchyard.mock_engine.server', 'switchyard.preprocessor.app') if m in sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        assert out.stdout.strip().splitlines()[-1] == "[]"


class TestGrpcClientEnv:
    """The commands that dial engines run gRPC with GRPC_CLIENT_ENV unless the operator set
    the variable; the mock engine keeps gRPC's defaults."""

    @staticmethod
    def experiments(command: str, environ: dict[str, str]) -> str:
        code = (
            "import os\n"
            "from switchyard.cli import main\n"
            f"try:\n    main([{command!r}, '--version'])\n"
            "except SystemExit:\n    pass\n"
            "print(os.environ.get('GRPC_EXPERIMENTS', '-'))"
        )
        env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | environ
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
            check=True, env=env,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[-1]

    @pytest.mark.parametrize("command", sorted(cli.GRPC_CLIENTS))
    def test_clients_get_it(self, command):
        assert self.experiments(command, {}) == cli.GRPC_CLIENT_ENV["GRPC_EXPERIMENTS"]

    def test_the_mock_engine_and_up_do_not(self):
        assert self.experiments("mock-engine", {}) == "-"
        assert self.experiments("up", {}) == "-"

    def test_the_operators_value_wins(self):
        assert self.experiments("router", {"GRPC_EXPERIMENTS": "x"}) == "x"


class TestConfigPrint:
    def test_flag_over_env_over_file_over_default(self, tmp_path: Path):
        config = tmp_path / "switchyard.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "router": {"router-mode": "random", "booking-ttl": 5.0, "request-ttl": 9},
                    "preprocessor": {"migration-limit": 1},
                }
            )
        )
        out = run(
            "config", "print", "router", "--config", str(config), "--request-ttl", "7",
            env={"SWITCHYARD_BOOKING_TTL": "2.5"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        printed = yaml.safe_load(out.stdout)["router"]
        assert printed["request-ttl"] == 7.0  # flag
        assert printed["booking-ttl"] == 2.5  # env over file
        assert printed["router-mode"] == "random"  # file
        assert printed["load-poll-interval"] == 0.5  # default
        lines = {line.split(":")[0].strip(): line for line in out.stdout.splitlines()}
        assert lines["request-ttl"].endswith("# flag")
        assert lines["booking-ttl"].endswith("# env SWITCHYARD_BOOKING_TTL")
        assert "# file" in lines["router-mode"] and lines["bind"].endswith("# default")

    def test_all_sections_read_back(self, tmp_path: Path):
        first = run("config", "print")
        assert first.returncode == 0, first.stderr
        assert set(yaml.safe_load(first.stdout)) == set(cli.SUBCOMMANDS)
        config = tmp_path / "printed.yaml"
        config.write_text(first.stdout)
        again = run("config", "print", "--config", str(config))
        assert again.returncode == 0, again.stderr
        assert yaml.safe_load(again.stdout) == yaml.safe_load(first.stdout)

    def test_a_bad_value_is_refused_naming_its_key(self, tmp_path: Path):
        config = tmp_path / "bad.yaml"
        config.write_text("dispatcher:\n  stall-timeout: soon\n")
        out = run("dispatcher", "--config", str(config))
        assert out.returncode == 2
        assert f"{config}: dispatcher.stall-timeout: not a number of seconds: 'soon'" in out.stderr
        out = run("router", env={"SWITCHYARD_ROUTER_MODE": "best"})
        assert out.returncode == 2
        assert "SWITCHYARD_ROUTER_MODE: 'best' is not one of" in out.stderr


class TestUpHandsTheConfigToItsChildren:
    def test_flag_and_environment(self, tmp_path: Path):
        from switchyard.stack import Launcher

        config = tmp_path / "c.yaml"
        config.write_text("router:\n  router-mode: random\nup:\n  log-format: json\n")
        for argv, env in (
            (["--config", str(config)], {}),
            ([], {"SWITCHYARD_CONFIG": str(config)}),
        ):
            args, resolved = cli.resolve("up", argv, environ=env)
            assert resolved["log-format"] == "json"
            common = Launcher(args, None, tmp_path).common  # type: ignore[arg-type]
            assert common[common.index("--config") + 1] == str(config)
            assert common[common.index("--log-format") + 1] == "json"


class TestRefusedAtParseTime:
    """A bad port, endpoint or count is a usage error (exit 2, the flag named), not a
    traceback once the stack started (bind() OverflowError, ZMQError, ValueError) nor a
    ZMQ bind that takes port 99999 modulo 65536."""

    @pytest.mark.parametrize(
        "command, argv",
        [
            ("up", ["--mock-engines", "sglang", "--http-port", "70000"]),
            ("up", ["--mock-engines", "sglang", "--admin-port", "-1"]),
            ("up", ["--mock-engines", "sglang", "--router-metrics-port", "65536"]),
            ("up", ["--mock-engines", "sglang", "--start-timeout", "0"]),  # "not ready after 0s"
            ("up", ["--mock-engines", "sglang", "--start-timeout", "-1"]),
            ("up", ["--mock-engines", "sglang", "--routers", "abc"]),
            ("preprocessor", ["--port", "-1"]),
            ("preprocessor", ["--admin-port", "x"]),
            ("preprocessor", ["--router", "nonsense"]),
            ("preprocessor", ["--dispatcher", "tcp://127.0.0.1"]),
            ("preprocessor", ["--max-body-bytes", "0"]),  # was: every request a 413
            ("preprocessor", ["--max-body-bytes", "-1"]),
            ("preprocessor", ["--keep-alive-timeout", "0"]),
            ("preprocessor", ["--keep-alive-timeout", "-5"]),
            ("preprocessor", ["--tokenizer", "=/tmp"]),  # was: exit 1, "no tokenizer.json"
            ("preprocessor", ["--tokenizer", "m="]),
            ("router", ["--bind", "tcp://127.0.0.1:99999"]),
            ("router", ["--fleet-control", "nonsense"]),
            ("router", ["--kv-events-bind", "bogus"]),
            ("router", ["--kv-events-proxy", "tcp://h:x"]),
            ("router", ["--kv-silence-warning", "-1"]),
            ("kv-proxy", ["--frontend", "tcp://*:0", "--backend", "tcp://127.0.0.1:99999"]),
            ("kv-proxy", ["--frontend", "tcp://*:0", "--backend", "tcp://*:0", "--ranks", "0"]),
            ("router", ["--load-poll-interval", "nan"]),
            ("dispatcher", ["--bind", "127.0.0.1:7300"]),
            ("dispatcher", ["--fleet-events", "tcp://h:-1"]),
            ("dispatcher", ["--stall-timeout", "-1"]),
            ("fleet", ["--worker", "grpc://h:1", "--control", "tcp://127.0.0.1:99999"]),
            ("fleet", ["--worker", "grpc://h:1", "--events", "x"]),
            ("fleet", ["--worker", "grpc://h:1", "--readmit-after", "0"]),
            ("fleet", ["--worker", "grpc://h:1", "--down-after", "0"]),
        ],
    )
    def test_usage_error(self, command, argv, capsys):
        with pytest.raises(SystemExit) as exited:
            cli.command_parser(command).parse_args(argv)
        assert exited.value.code == 2
        assert f"argument {argv[-2]}" in capsys.readouterr().err

    @pytest.mark.parametrize(
        "endpoint", ["tcp://127.0.0.1:0", "tcp://*:5557", "tcp://[::1]:7100", "ipc:///tmp/s"]
    )
    def test_good_endpoints_pass(self, endpoint):
        args = cli.command_parser("router").parse_args(["--bind", endpoint])
        assert args.bind == endpoint


class TestTakenPorts:
    """A port another process holds is one line naming it and exit 1 (router, dispatcher,
    preprocessor, mock engine: it was an OSError / ZMQError traceback)."""

    @pytest.fixture
    def taken(self):
        import socket

        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            yield held.getsockname()[1]

    @pytest.mark.parametrize(
        "argv, message",
        [
            (["router", "--metrics-port", "{p}"], "router cannot start: cannot serve /metrics"),
            (["router", "--bind", "tcp://127.0.0.1:{p}", "--metrics-port", "off"], "in use"),
            (["dispatcher", "--metrics-port", "{p}"], "dispatcher cannot start: cannot serve"),
            (["dispatcher", "--bind", "tcp://127.0.0.1:{p}", "--metrics-port", "off"], "in use"),
            (["preprocessor", "--port", "0", "--metrics-port", "{p}"], "cannot serve /metrics"),
            (["mock-engine", "--protocol", "sglang", "--port", "{p}"], "cannot start"),
            (
                ["mock-engine", "--protocol", "sglang", "--port", "0", "--metrics-port", "{p}"],
                "cannot serve /metrics",
            ),
        ],
    )
    def test_one_line_and_exit_1(self, taken, argv, message):
        out = run(*(a.format(p=taken) for a in argv))
        assert out.returncode == 1, out.stderr
        assert "Traceback" not in out.stderr
        assert message in out.stderr
        assert "already in use" in out.stderr.lower() or "failed to bind" in out.stderr.lower()


def test_a_missing_api_keys_file_is_named(tmp_path: Path):
    missing = tmp_path / "keys.txt"
    out = run("preprocessor", "--port", "0", "--api-keys-file", str(missing))
    assert out.returncode == 1
    assert f"--api-keys-file {missing}: [Errno 2]" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_nan_stream_timeout_is_refused():
    out = run("preprocessor", "--port", "0", "--route-timeout", "nan")
    assert out.returncode == 1
    assert "timeouts must be positive" in out.stderr
