"""Where the configured worker list comes from: `--worker` flags plus a watched workers file,
with the `--prefill` list applied.

`load` fails loudly (startup). `poll` re-reads the file and returns the new list when its
content changed; a file that cannot be read or parsed is logged once and the last good list
stays in force.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from switchyard.common.workers import WorkerSpec, combine_workers, parse_workers_text

log = logging.getLogger(__name__)


class WorkerSource:
    def __init__(
        self,
        workers: Sequence[WorkerSpec] = (),
        file: str | Path | None = None,
        prefill: Sequence[str] = (),
    ) -> None:
        self._static = list(workers)
        self.file = Path(file) if file is not None else None
        self._prefill = list(prefill)
        self._seen: bytes | None = None  # file content last looked at, good or bad
        self._problem = ""  # last error logged, so that it is logged once

    @property
    def prefill(self) -> list[str]:
        """The --prefill list (applied to workers the admin API adds too)."""
        return list(self._prefill)

    def static_ids(self) -> set[int]:
        """The instance ids of the --worker flags."""
        return {spec.instance_id for spec in self._static}

    def load(self) -> list[WorkerSpec]:
        """The full list now. Raises ValueError (bad config) or OSError (unreadable file)."""
        if self.file is None:
            return combine_workers([self._static], self._prefill)
        content = self.file.read_bytes()
        workers = self._parse(content)
        self._seen, self._problem = content, ""
        return workers

    def poll(self) -> list[WorkerSpec] | None:
        """The new list when the file changed and parses; None otherwise. Blocking file I/O:
        run it in a thread."""
        if self.file is None:
            return None
        try:
            content = self.file.read_bytes()
        except OSError as exc:
            self._report(f"cannot read workers file {self.file}: {exc}")
            return None
        if content == self._seen:
            return None
        self._seen = content
        try:
            workers = self._parse(content)
        except ValueError as exc:
            self._report(f"workers file rejected, keeping the last good list: {exc}")
            return None
        self._problem = ""
        return workers

    def _parse(self, content: bytes) -> list[WorkerSpec]:
        assert self.file is not None
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.file}: not UTF-8 text: {exc}") from None
        return combine_workers([self._static, parse_workers_text(text, self.file)], self._prefill)

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            log.error("%s", problem)
            self._problem = problem
