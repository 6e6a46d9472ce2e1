"""One configuration for every command, read through each command's own argparse parser.

Every flag of every command can come from the command line, from an environment variable
`SWITCHYARD_<FLAG>` (`--route-timeout` -> SWITCHYARD_ROUTE_TIMEOUT) or from a YAML file given
with `--config` (or SWITCHYARD_CONFIG), with one section per command:

    preprocessor:
      route-timeout: 2.5
      tool-call-parser: [qwen3=hermes]
    router:
      router-mode: kv

Precedence, per flag: command line > environment > file > the flag's default. A value from
the environment or the file goes through the flag's own type and choices, so it is checked
exactly like the same flag typed by hand; a bad one raises ConfigError naming its key (or
variable). Unknown sections and keys are errors too. Repeatable flags take a YAML list (or
comma-separated text in the environment); given on the command line they replace, not
extend, what the file or environment said. Switches take YAML booleans (or 1/0, true/false,
yes/no, on/off). A YAML list for a flag that takes comma-separated text is joined with commas.
The outcome is a frozen `Settings` (value and source of every flag), which
`switchyard config print` shows.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

ENV_PREFIX = "SWITCHYARD_"
CONFIG_ENV = "SWITCHYARD_CONFIG"
# Flags of the config layer itself, not settings.
_OWN = ("help", "version", "config")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

FLAG, ENV, FILE, DEFAULT = "flag", "env", "file", "default"


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message names it."""


@dataclass(frozen=True)
class Setting:
    key: str  # the flag without its dashes: "route-timeout"
    value: Any  # as the flag's type made it
    source: str  # FLAG | ENV | FILE | DEFAULT
    where: str = ""  # the variable or file key it came from


@dataclass(frozen=True)
class Settings:
    command: str
    items: Mapping[str, Setting]

    def __getitem__(self, key: str) -> Any:
        return self.items[key].value


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace("-", "_")


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settings: flag name (without dashes) -> its action."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in _OWN or isinstance(action, argparse._HelpAction):
            continue
        out[longs[0][2:]] = action
    return out


def load_file(path: str | Path) -> dict[str, Any]:
    """The file's sections (command -> mapping); ConfigError for unreadable or bad YAML."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: expected a mapping of command sections, got {type(data).__name__}"
        )
    return data


def check_sections(data: Mapping[str, Any], commands: Sequence[str], path: str | Path) -> None:
    for name, section in data.items():
        if name not in commands:
            raise ConfigError(
                f"config file {path}: unknown section {name!r}{_near(str(name), commands)}; "
                f"sections are {', '.join(commands)}"
            )
        if section is not None and not isinstance(section, dict):
            raise ConfigError(
                f"config file {path}: section {name!r} must be a mapping of flag names to "
                f"values, got {type(section).__name__}"
            )


def resolve(
    command: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    file_data: Mapping[str, Any] | None = None,
    file_path: str | Path = "",
    require: bool = True,
) -> tuple[argparse.Namespace, Settings]:
    """Parse `argv` with the environment and the file's section for `command` underneath.
    ConfigError for a bad environment or file value; argparse exits for a bad flag. Without
    `require`, required flags may be missing (config print shows them as null)."""
    environ = os.environ if environ is None else environ
    section = (file_data or {}).get(command) or {}
    known = options(parser)
    for key in section:
        if key not in known:
            raise ConfigError(
                f"config file {file_path}: {command}.{key}: no such flag of "
                f"`switchyard {command}`{_near(str(key), list(known))}"
            )
    layered: dict[str, Setting] = {}
    for key, action in known.items():
        name = env_name(key)
        if name in environ:
            value = convert(action, environ[name], f"environment variable {name}", text=True)
            layered[key] = Setting(key, value, ENV, name)
        elif section.get(key) is not None:
            where = f"{file_path}: {command}.{key}"
            value = convert(action, section[key], f"config file {where}")
            layered[key] = Setting(key, value, FILE, where)
    # A switch set to false is the switch not given (two switches may share one dest).
    preset = argparse.Namespace(
        **{
            known[k].dest: s.value
            for k, s in layered.items()
            if known[k].nargs != 0 or s.value == known[k].const
        }
    )
    for key, action in known.items():
        if key in layered or not require:
            action.required = False  # given by the environment or the file
    args = parser.parse_args(list(argv), preset)
    items: dict[str, Setting] = {}
    for key, action in known.items():
        value = getattr(args, action.dest, None)
        below = layered.get(key)
        if action.nargs == 0:  # a switch is on or off (two may share a dest)
            on = value == action.const
            source = FLAG if _on_command_line(action, argv) else below.source if below else DEFAULT
            items[key] = Setting(key, on, source, below.where if below and source != FLAG else "")
            continue
        if below is None:
            source = FLAG if _on_command_line(action, argv) else DEFAULT
            items[key] = Setting(key, value, source)
        elif value is below.value and not _on_command_line(action, argv):
            items[key] = below
        else:
            if isinstance(action, argparse._AppendAction) and isinstance(value, list):
                # argparse appended the flags to the layered list: the flags alone win.
                value = value[len(below.value) :]
                setattr(args, action.dest, value)
            items[key] = Setting(key, value, FLAG)
    return args, Settings(command, MappingProxyType(items))


def convert(action: argparse.Action, raw: Any, where: str, *, text: bool = False) -> Any:
    """A value for `action` from the environment (`text`) or a YAML file, checked like a flag."""
    if action.nargs == 0:  # a switch: store_true / store_false / store_const
        return action.const if _switch(raw, where) else action.default
    if isinstance(action, argparse._AppendAction):
        if text:
            items = [part.strip() for part in str(raw).split(",") if part.strip()]
        elif isinstance(raw, list):
            items = raw
        else:
            items = [raw]
        return [_scalar(action, item, f"{where}[{n}]") for n, item in enumerate(items)]
    if isinstance(raw, list) and not text:  # e.g. up's --mock-engines sglang,vllm
        for n, item in enumerate(raw):
            if isinstance(item, bool | dict | list) or item is None:
                raise ConfigError(f"{where}[{n}]: expected a plain value, got {item!r}")
        raw = ",".join(str(item) for item in raw)
    return _scalar(action, raw, where)


def _scalar(action: argparse.Action, raw: Any, where: str) -> Any:
    if isinstance(raw, bool) or isinstance(raw, dict | list) or raw is None:
        raise ConfigError(f"{where}: expected {_kind(action)}, got {raw!r}")
    value: Any = raw if isinstance(raw, str) else str(raw)
    if action.type is not None:
        convert_type: Any = action.type
        try:
            value = convert_type(value)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            if convert_type in (int, float):  # the builtins' messages name no flag
                raise ConfigError(f"{where}: expected {_kind(action)}, got {value!r}") from None
            raise ConfigError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ConfigError(f"{where}: {value!r} is not one of {choices}")
    return value


def _kind(action: argparse.Action) -> str:
    kind = getattr(action.type, "__name__", "") if action.type is not None else "str"
    return {"int": "an integer", "float": "a number", "str": "a string"}.get(kind, "a value")


def _switch(raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}: expected true or false, got {raw!r}")


def _on_command_line(action: argparse.Action, argv: Sequence[str]) -> bool:
    flags = action.option_strings
    return any(arg in flags or arg.split("=", 1)[0] in flags for arg in argv)


def _near(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---- rendering (switchyard config print) ----------------------------------------------------


def plain(value: Any) -> Any:
    """A YAML-safe form of a setting's value that reads back as the same setting."""
    if value is None or isinstance(value, bool):
        return value
    for kind in (int, float, str):  # subclasses too (metrics' DefaultPort)
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return str(value)  # Path, PortRange, WorkerSpec: their flag text


def render(settings: Sequence[Settings]) -> str:
    """YAML with one section per command; each value's source as a comment."""
    lines: list[str] = []
    for one in settings:
        lines.append(f"{one.command}:")
        for key, item in one.items.items():
            shown = yaml.safe_dump(plain(item.value), default_flow_style=True, width=10**6)
            shown = shown.strip().removesuffix("...").strip()
            source = item.source if not item.where else f"{item.source} {item.where}"
            lines.append(f"  {key}: {shown}  # {source}")
    return "\n".join(lines) + "\n"
