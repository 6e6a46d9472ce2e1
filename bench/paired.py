"""Before/after on the whole stack: bench/load.py --with-smg from two checkouts, alternating.

One load.py run measures the floor, Switchyard and smg on the same engines, so its ratios to
smg are fair within the run; but two runs an hour apart differ by more than most changes do
(smg's own CPU per request moves 30% between runs here). This runs the two checkouts'
load.py one after another, `--pairs` times, in alternating order (ABBA...: the stack a pair
runs first was the slower one in either order, by 0.3-0.7 s of a 9 s phase), and reports each
run's ratios to smg and the median per checkout.

    python bench/paired.py --ref ../before          # that checkout (with its .venv) vs this one
    python bench/paired.py --ref ../before --pairs 3 -- --max-tokens 256 --no-stream

Arguments after `--` go to both load.py runs. Results: bench/results/paired.md (each run's
load.md/load.json under paired/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOADS = ("c1", "c32", "c128")
SWITCHYARD = "switchyard-kv"


def checkout_python(root: Path) -> Path:
    python = root / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{root} has no .venv (run `make install` there first)")
    return python


def run_load(root: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    argv = [str(checkout_python(root)), str(root / "bench" / "load.py"), "--with-smg"]
    # One smg install serves both checkouts (the first run makes it), unless one is given.
    if "--smg-venv" not in extra:
        argv += ["--smg-venv", str(HERE / ".smg-venv")]
    argv += ["--router-mode", "kv", "--no-plots", "--out-dir", str(out), *extra]
    # From the checkout's own folder: `python -m switchyard` puts the working directory first
    # on sys.path, so from another checkout's folder it would run that one's code.
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=root)
    result: dict[str, Any] = json.loads((out / "load.json").read_text())
    return result


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """Switchyard / smg within one run: frontend CPU per request, req/s, TTFT p50."""
    targets = {t["key"]: t for t in result["targets"]}
    ours, smg = targets.get(SWITCHYARD), targets.get("smg")
    out: dict[str, float] = {}
    if ours is None or smg is None:
        return out
    for load in LOADS:
        a, b = ours["phases"].get(load), smg["phases"].get(load)
        if not a or not b:
            continue
        cpu_a = sum(a["cpu"]["frontend"].values()) / a["n"]
        cpu_b = sum(b["cpu"]["frontend"].values()) / b["n"]
        out[f"cpu {load}"] = cpu_a / cpu_b if cpu_b else float("nan")
        out[f"cpu ms {load}"] = 1000 * cpu_a
        out[f"req/s {load}"] = a["req_s"] / b["req_s"]
        out[f"ttft p50 {load}"] = a["ttft_p50"] / b["ttft_p50"]
    return out


def table(rows: list[tuple[str, dict[str, float]]]) -> list[str]:
    keys = [k for k in rows[0][1]] if rows else []
    lines = ["| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for label, values in rows:
        cells = [f"{values[k]:.2f}" + ("" if k.startswith("cpu ms") else "x") for k in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="the other checkout (before)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument("load_args", nargs="*", help="after --: arguments for load.py")
    args = parser.parse_args()
    this = HERE.parent
    checkouts = {"before": args.ref.resolve(), "after": this}
    runs: list[tuple[str, dict[str, float]]] = []
    started = time.time()
    for pair in range(args.pairs):
        order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
        for label in order:
            out = args.out_dir / "paired" / f"{label}-{pair + 1}"
            print(f"pair {pair + 1}: {label} ({checkouts[label]})", file=sys.stderr, flush=True)
            runs.append(
                (f"{label} {pair + 1}", ratios(run_load(checkouts[label], out, args.load_args)))
            )
    lines = [
        "# Paired load runs: Switchyard / smg, before and after",
        "",
        f"before = {checkouts['before']}, after = {checkouts['after']}; load.py args: "
        f"`{' '.join(args.load_args) or '(defaults)'}`; {args.pairs} pairs in alternating "
        f"order, {time.time() - started:.0f} s. `cpu` = frontend CPU per request / smg's, "
        "`req/s` and `ttft p50` = Switchyard / smg, all within each run; `cpu ms` = "
        "Switchyard's CPU ms per request.",
        "",
        *table(runs),
        "",
        "Medians:",
        "",
    ]
    medians = []
    for label in ("before", "after"):
        mine = [values for name, values in runs if name.startswith(label) and values]
        if mine:
            medians.append((label, {k: statistics.median(v[k] for v in mine) for k in mine[0]}))
    lines += table(medians)
    text = "\n".join(lines) + "\n"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "paired.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
