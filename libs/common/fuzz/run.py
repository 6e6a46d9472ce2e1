"""Build the fuzz harnesses and run each for a while (`make fuzz`; CI runs a short one).

Every C parser of bytes that come from the network has a libFuzzer harness here, built with
clang's AddressSanitizer and UndefinedBehaviorSanitizer (any finding aborts the run):

  frames      engines/_frames_core.h: an engine connection's HTTP/2 frames and the gRPC
              messages of relayed streams (the dispatcher's per-token path)
  blockhash   _blockhash.c: the msgpack token arrays of engines' KV events
  pretokens   preprocessor/_pretokens.c: the split and cached ids of prompt text from HTTP
              clients, against its Python form (an embedded interpreter runs both)

Seeds come from seeds.py (real engine streams and token arrays); the corpus grows under
build/fuzz/corpus/<harness>, and a crashing input is written to build/fuzz/ (the run fails).
clang and libFuzzer come from Debian (clang, libclang-rt-14-dev); with --install they are
installed when missing (needs root, as CI is).

    python libs/common/fuzz/run.py --seconds 60
    python libs/common/fuzz/run.py --seconds 5 --harness frames
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
HARNESSES = ("frames", "blockhash", "pretokens")
WITH_PYTHON = ("blockhash", "pretokens")  # harnesses that include an extension's glue
FLAGS = ["-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]
DEBIAN_PACKAGES = ("clang", "libclang-rt-14-dev")
MISSING = f"clang with libFuzzer is missing: apt-get install {' '.join(DEBIAN_PACKAGES)}"


def libfuzzer_error(clang: str, work: Path) -> str | None:
    """None when clang can link a libFuzzer binary (the runtime is a separate Debian
    package), else what clang said."""
    probe = work / "probe.c"
    probe.write_text(
        "#include <stdint.h>\n#include <stddef.h>\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n"
    )
    done = subprocess.run(
        [clang, *FLAGS, str(probe), "-o", str(work / "probe")], capture_output=True
    )
    return None if done.returncode == 0 else done.stderr.decode(errors="replace")[-2000:]


def apt_get(*args: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", *args], env=env, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"apt-get {' '.join(args)} failed (exit {done.returncode})")


def find_clang(work: Path, install: bool) -> str | None:
    clang = shutil.which("clang")
    if clang is not None and libfuzzer_error(clang, work) is None:
        return clang
    if not install:
        return None
    if os.geteuid() != 0:
        raise SystemExit(MISSING)
    print("installing clang and libFuzzer from Debian's packages", flush=True)
    apt_get("update", "-qq")
    apt_get("install", "-y", "-qq", *DEBIAN_PACKAGES)
    clang = shutil.which("clang")
    if clang is None:
        raise SystemExit(f"apt-get installed {' '.join(DEBIAN_PACKAGES)} but no clang is on PATH")
    error = libfuzzer_error(clang, work)
    if error is not None:
        raise SystemExit(f"clang was installed but cannot link a libFuzzer binary:\n{error}")
    return clang


def build(clang: str, harness: str, work: Path) -> Path:
    out = work / f"{harness}_fuzz"
    argv = [clang, *FLAGS, str(HERE / f"{harness}_fuzz.c"), "-o", str(out)]
    if harness in WITH_PYTHON:  # the extension includes Python.h (pretokens runs it)
        libdir = sysconfig.get_config_var("LIBDIR")
        argv[-2:-2] = [f"-I{sysconfig.get_paths()['include']}"]
        argv += [f"-L{libdir}", f"-lpython{sysconfig.get_config_var('LDVERSION')}"]
        argv += [f"-Wl,-rpath,{libdir}"]
    subprocess.run(argv, check=True)
    return out


def fuzz(binary: Path, corpus: Path, seeds: Path, seconds: float, work: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    argv = [str(binary), f"-max_total_time={max(1, round(seconds))}", "-timeout=10"]
    argv += [f"-artifact_prefix={work}/", "-print_final_stats=1", str(corpus), str(seeds)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env())
    stats = [line for line in done.stderr.splitlines() if line.startswith(("Done", "stat::"))]
    print(f"{binary.name}: " + "; ".join(stats[:3]), flush=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-6000:])
        raise SystemExit(f"{binary.name} found a failure (the input is in {work}/)")


def _env() -> dict[str, str]:
    """The pretokens harness's reference: the regex pretokens.py splits text with."""
    from switchyard.preprocessor.pretokens import _DEEPSEEK_V3_PIECES

    regex = _DEEPSEEK_V3_PIECES.__self__.pattern  # type: ignore[attr-defined]
    return {**os.environ, "SWITCHYARD_PRETOKENS_REGEX": regex, "PYTHONHOME": sys.base_prefix}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per harness")
    parser.add_argument("--harness", choices=HARNESSES, action="append")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--install", action="store_true", help="apt-get clang when missing")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    clang = find_clang(work, args.install)
    if clang is None:
        raise SystemExit(MISSING)
    seeds = work / "seeds"
    subprocess.run([sys.executable, str(HERE / "seeds.py"), str(seeds)], check=True)
    for harness in args.harness or HARNESSES:
        binary = build(clang, harness, work)
        fuzz(binary, work / "corpus" / harness, seeds / harness, args.seconds, work)


if __name__ == "__main__":
    main()
