"""Every test run keeps stored responses in a folder of its own: a preprocessor (in process or
a child of `switchyard up`) started by a test without --data-dir writes its SQLite store
there (SWITCHYARD_DATA_DIR, inherited), never into the user's ~/.local/share/switchyard."""

from __future__ import annotations

import os
import shutil
import tempfile

_folder: str | None = None


def pytest_configure(config: object) -> None:
    global _folder
    if "SWITCHYARD_DATA_DIR" not in os.environ:
        _folder = tempfile.mkdtemp(prefix="switchyard-test-data-")
        os.environ["SWITCHYARD_DATA_DIR"] = _folder


def pytest_unconfigure(config: object) -> None:
    if _folder is not None:
        os.environ.pop("SWITCHYARD_DATA_DIR", None)
        shutil.rmtree(_folder, ignore_errors=True)
