"""Summaries of load phases, the markdown report and the PNG plots of bench/load.py."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import pct
from loadgen import Sample

FLOOR = "floor"
SMG = "smg"


@dataclass
class TargetResult:
    key: str  # "floor", "switchyard-round_robin", "switchyard-kv", "smg"
    title: str
    what: str
    status: str = "ok"  # "ok", or why the target was not measured
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)  # load name -> summary
    ttfts: dict[str, list[float]] = field(default_factory=dict)  # load name -> TTFT ms

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def summarize(
    samples: Sequence[Sample],
    wall: float,
    cpu: dict[str, dict[str, float]],
    **info: Any,
) -> dict[str, Any]:
    good = [s for s in samples if s.ok]
    bad = [s for s in samples if not s.ok]
    out: dict[str, Any] = dict(info)
    out.update(n=len(good), errors=len(bad), first_error=bad[0].error if bad else "", wall_s=wall)
    if not good:
        return out
    ttft = [s.ttft * 1e3 for s in good]
    itl = [s.itl * 1e3 for s in good if s.itl is not None]
    e2e = [s.e2e * 1e3 for s in good]
    tokens = sum(s.tokens for s in good)
    out.update(
        req_s=len(good) / wall,
        tok_s=tokens / wall,
        tokens_per_req=tokens / len(good),
        ttft_p50=statistics.median(ttft),
        ttft_p99=pct(ttft, 0.99),
        ttft_mean=statistics.fmean(ttft),
        itl_p50=statistics.median(itl) if itl else 0.0,
        itl_p99=pct(itl, 0.99) if itl else 0.0,
        e2e_p50=statistics.median(e2e),
        e2e_p99=pct(e2e, 0.99),
        cpu={group: dict(sorted(procs.items())) for group, procs in cpu.items()},
    )
    per_k = 1000 / len(good)
    parts = {group: sum(procs.values()) * per_k for group, procs in cpu.items()}
    parts["total"] = sum(parts.values())
    out["cpu_per_1k"] = parts
    return out


def _f(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "—"
    return f"{value / base:.2f}x"


def _get(target: TargetResult | None, load: str, key: str) -> float | None:
    if target is None or not target.ok:
        return None
    phase = target.phases.get(load)
    if not phase or key not in phase:
        return None
    return phase[key]


def _cpu(target: TargetResult | None, load: str, part: str) -> float | None:
    if target is None or not target.ok or load not in target.phases:
        return None
    return target.phases[load].get("cpu_per_1k", {}).get(part)


def _missing_row(target: TargetResult, columns: int) -> str:
    reason = target.status if len(target.status) <= 100 else target.status[:97] + "..."
    return f"| {target.title} | not measured: {reason} |" + " |" * (columns - 2)


def markdown(
    targets: list[TargetResult],
    header: list[str],
    latency_loads: list[str],
    throughput_loads: list[str],
    open_loads: list[str],
) -> str:
    by_key = {t.key: t for t in targets}
    floor = by_key.get(FLOOR)
    smg = by_key.get(SMG)
    lines = list(header)

    lines += ["", "## Targets", "", "| target | what | status |", "|---|---|---|"]
    for t in targets:
        lines.append(f"| {t.title} | {t.what} | {t.status} |")

    lines += [
        "",
        "## Latency, closed loop (fixed concurrency)",
        "",
        "Added = this target minus the floor at the same load point, in the same run.",
        "",
        "| target | concurrency | TTFT p50 ms | TTFT p99 ms | added TTFT p50 ms "
        "| added TTFT p99 ms | ITL p50 ms | E2E p50 ms | E2E p99 ms | TTFT p50 / floor "
        "| TTFT p50 / smg | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in latency_loads:
        for t in targets:
            if not t.ok:
                lines.append(_missing_row(t, 12))
                continue
            p = t.phases[load]
            fl50, fl99 = _get(floor, load, "ttft_p50"), _get(floor, load, "ttft_p99")
            v50, v99 = p.get("ttft_p50"), p.get("ttft_p99")
            added50 = None if fl50 is None or v50 is None else v50 - fl50
            added99 = None if fl99 is None or v99 is None else v99 - fl99
            lines.append(
                f"| {t.title} | {p['concurrency']} | {_f(v50, 2)} | {_f(v99, 2)} | "
                f"{_f(added50, 2)} | {_f(added99, 2)} | {_f(p.get('itl_p50'), 2)} | "
                f"{_f(p.get('e2e_p50'))} | {_f(p.get('e2e_p99'))} | {_ratio(v50, fl50)} | "
                f"{_ratio(v50, _get(smg, load, 'ttft_p50'))} | {p['errors']} |"
            )

    lines += [
        "",
        "## Maximum throughput, closed loop",
        "",
        "| target | concurrency | requests/s | output tokens/s | req/s / floor | req/s / smg "
        "| TTFT p50 ms | TTFT p99 ms | ITL p50 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in throughput_loads:
        for t in targets:
            if not t.ok:
                lines.append(_missing_row(t, 10))
                continue
            p = t.phases[load]
            rps = p.get("req_s")
            lines.append(
                f"| {t.title} | {p['concurrency']} | {_f(rps)} | {_f(p.get('tok_s'), 0)} | "
                f"{_ratio(rps, _get(floor, load, 'req_s'))} | "
                f"{_ratio(rps, _get(smg, load, 'req_s'))} | {_f(p.get('ttft_p50'))} | "
                f"{_f(p.get('ttft_p99'))} | {_f(p.get('itl_p50'), 2)} | {p['errors']} |"
            )

    if open_loads:
        lines += [
            "",
            "## Open loop (Poisson arrivals)",
            "",
            "| target | offered req/s | achieved req/s | TTFT p50 ms | TTFT p99 ms "
            "| added TTFT p50 ms | ITL p50 ms | E2E p99 ms | TTFT p50 / smg | errors |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for load in open_loads:
            for t in targets:
                if not t.ok:
                    lines.append(_missing_row(t, 10))
                    continue
                p = t.phases[load]
                v50, fl50 = p.get("ttft_p50"), _get(floor, load, "ttft_p50")
                added = None if v50 is None or fl50 is None else v50 - fl50
                lines.append(
                    f"| {t.title} | {p['rate']:g} | {_f(p.get('req_s'))} | {_f(v50, 2)} | "
                    f"{_f(p.get('ttft_p99'), 2)} | {_f(added, 2)} | {_f(p.get('itl_p50'), 2)} | "
                    f"{_f(p.get('e2e_p99'))} | {_ratio(v50, _get(smg, load, 'ttft_p50'))} | "
                    f"{p['errors']} |"
                )

    lines += [
        "",
        "## CPU seconds per 1000 requests",
        "",
        "utime + stime from /proc of every process, before and after each phase. client: the "
        "load generator (HTTP + SSE parsing, or the gRPC client for the floor); frontend: every "
        "process of the gateway (switchyard up and its children, or smg); engines: the mock "
        "engines.",
        "",
        "| target | load | client | frontend | engines | total | total / floor | frontend / smg "
        "| frontend processes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for load in dict.fromkeys([*latency_loads, *throughput_loads, *open_loads]):
        for t in targets:
            if not t.ok:
                lines.append(_missing_row(t, 9))
                continue
            p = t.phases[load]
            procs = p.get("cpu", {}).get("frontend", {})
            per_k = 1000 / p["n"] if p["n"] else 0.0
            detail = ", ".join(f"{name} {sec * per_k:.2f}" for name, sec in procs.items()) or "—"
            front = _cpu(t, load, "frontend")
            total = _cpu(t, load, "total")
            lines.append(
                f"| {t.title} | {load} | {_f(_cpu(t, load, 'client'), 2)} | {_f(front, 2)} | "
                f"{_f(_cpu(t, load, 'engines'), 2)} | {_f(total, 2)} | "
                f"{_ratio(total, _cpu(floor, load, 'total'))} | "
                f"{'—' if t.key == FLOOR else _ratio(front, _cpu(smg, load, 'frontend'))} | "
                f"{detail} |"
            )
    return "\n".join(lines) + "\n"


def plots(
    targets: list[TargetResult],
    out_dir: Path,
    latency_loads: list[str],
    throughput_loads: list[str],
    open_loads: list[str],
) -> tuple[list[Path], str]:
    """PNG files written, and a note (why nothing was plotted, if so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return [], "matplotlib is not installed (pip install -e '.[bench]'): plots skipped"
    done = [t for t in targets if t.ok]
    names = [t.title for t in done]
    colors = [f"C{i}" for i in range(len(done))]
    written = []

    loads = [*latency_loads, *open_loads]
    fig, axes = plt.subplots(1, len(loads), figsize=(4.5 * len(loads), 4.2), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        x = range(len(done))
        p50 = [t.phases[load].get("ttft_p50", 0) for t in done]
        p99 = [t.phases[load].get("ttft_p99", 0) for t in done]
        ax.bar([i - 0.2 for i in x], p50, 0.4, color=colors, label="p50")
        ax.bar([i + 0.2 for i in x], p99, 0.4, color=colors, alpha=0.45, hatch="//", label="p99")
        ax.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"TTFT, {load}")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "load_ttft.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, key, unit in ((axes[0], "req_s", "requests/s"), (axes[1], "tok_s", "output tokens/s")):
        width = 0.8 / max(1, len(throughput_loads))
        for j, load in enumerate(throughput_loads):
            values = [t.phases[load].get(key, 0) for t in done]
            xs = [i + (j - (len(throughput_loads) - 1) / 2) * width for i in range(len(done))]
            ax.bar(xs, values, width, label=load, color=f"C{j}")
        ax.set_xticks(list(range(len(done))), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"Throughput ({unit})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "load_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    cpu_loads = throughput_loads
    fig, axes = plt.subplots(
        1, len(cpu_loads), figsize=(5 * len(cpu_loads), 4.2), squeeze=False, sharey=True
    )
    for ax, load in zip(axes[0], cpu_loads, strict=True):
        bottom = [0.0] * len(done)
        for j, part in enumerate(("client", "frontend", "engines")):
            values = [t.phases[load].get("cpu_per_1k", {}).get(part, 0.0) for t in done]
            ax.bar(range(len(done)), values, 0.6, bottom=bottom, label=part, color=f"C{j}")
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(list(range(len(done))), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"CPU seconds per 1000 requests, {load}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "load_cpu.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    cdf_loads = list(dict.fromkeys(latency_loads[1:] + throughput_loads)) or latency_loads
    fig, axes = plt.subplots(1, len(cdf_loads), figsize=(6 * len(cdf_loads), 4.2), squeeze=False)
    for ax, load in zip(axes[0], cdf_loads, strict=True):
        for i, t in enumerate(done):
            values = sorted(t.ttfts.get(load, []))
            if values:
                ys = [(k + 1) / len(values) for k in range(len(values))]
                ax.step(values, ys, where="post", label=t.title, color=colors[i])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("TTFT ms (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFT distribution, {load}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "load_ttft_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written, ""
