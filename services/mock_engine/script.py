"""Scripted output (`--script FILE`): a prompt that contains a marker gets that rule's text.

The file is JSON: a list of {"marker": "...", "output": "..."} rules, or an object mapping
marker -> output. A request's prompt is detokenized (special tokens kept, so template markup
can be a marker too); among the rules whose marker occurs in it, the one whose last occurrence
ends latest wins (ties: the earlier rule). So in a multi-turn conversation the newest turn's
marker decides: a tool result's marker beats the question asked before it. The output is
tokenized with the engine's tokenizer (special tokens such as tool-call markup become their own
ids), emitted token by token and followed by EOS; a constrained request ignores the script.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from switchyard.mock_engine.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    marker: str
    output: str


class Script:
    def __init__(self, rules: list[Rule]) -> None:
        self.rules = tuple(rules)

    def __len__(self) -> int:
        return len(self.rules)

    def match(self, prompt_text: str) -> Rule | None:
        best: Rule | None = None
        best_end = -1
        for rule in self.rules:
            start = prompt_text.rfind(rule.marker)
            if start == -1:
                continue
            end = start + len(rule.marker)
            if end > best_end:
                best, best_end = rule, end
        return best


def load_script(path: Path) -> Script:
    """Read and check a script file; ConfigError (field "script") on anything malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("script", f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("script", f"{path} is not JSON: {exc}") from None
    if isinstance(data, dict):
        items = [{"marker": k, "output": v} for k, v in data.items()]
    elif isinstance(data, list):
        items = data
    else:
        raise ConfigError("script", f"{path}: a list of rules or an object of marker -> output")
    rules: list[Rule] = []
    for number, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError("script", f"{path}: rule {number} is not an object")
        marker, output = item.get("marker"), item.get("output")
        if not isinstance(marker, str) or not marker:
            raise ConfigError("script", f"{path}: rule {number} needs a non-empty marker")
        if not isinstance(output, str):
            raise ConfigError("script", f"{path}: rule {number} needs an output string")
        rules.append(Rule(marker, output))
    if not rules:
        raise ConfigError("script", f"{path} has no rules")
    return Script(rules)
