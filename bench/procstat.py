"""CPU seconds of process trees, read straight from /proc (Linux; no psutil).

A `CpuMeter` is given named groups of root pids ("client", "frontend", "engines"); a snapshot
walks every root's process tree and reads utime + stime of each process; the difference of two
snapshots is the CPU each process spent in between, labelled by what the process is
(`preprocessor`, `router`, `engine-0`, `smg`, ...). `wakeups` counts a process's wake-ups
(voluntary context switches of all its threads).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def read_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process, None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name sits in parentheses and may itself contain spaces or parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is the state; then ppid, ..., utime and stime are the 14th and 15th of the line.
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of a process so far: each is a sleep that
    ended in a wake-up (an epoll, a futex, a ZMQ mailbox), a count the machine's speed does
    not change, unlike CPU seconds."""
    count = 0
    for task in (PROC / str(pid) / "task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                count += int(line.split()[1])
    return count


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = read_stat(int(entry.name))
        if stat is not None:
            kids[stat[0]].append(int(entry.name))
    return kids


def tree(root: int, kids: dict[int, list[int]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def label(pid: int) -> str:
    """What a process is: the switchyard subcommand, else its command name."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        comm = (PROC / str(pid) / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "gone"
    args = [a.decode(errors="replace") for a in argv if a]
    for i, arg in enumerate(args[:-1]):
        if arg == "switchyard" or arg.endswith("/switchyard"):
            return args[i + 1]
    if comm.startswith("smg"):
        return "smg"
    return comm


@dataclass
class CpuMeter:
    """Named groups of process trees. `own_only` groups count the root process alone (the
    bench's own process is the root of everything it started)."""

    groups: dict[str, list[int]]
    own_only: set[str] = field(default_factory=set)
    names: dict[int, str] = field(default_factory=dict)

    def name(self, pid: int) -> str:
        if pid not in self.names:
            self.names[pid] = label(pid)
        return self.names[pid]

    def snapshot(self) -> dict[tuple[str, int], float]:
        kids = children_map()
        out: dict[tuple[str, int], float] = {}
        for group, roots in self.groups.items():
            for root in roots:
                pids = [root] if group in self.own_only else tree(root, kids)
                for pid in pids:
                    stat = read_stat(pid)
                    if stat is not None:
                        out[(group, pid)] = stat[1]
        return out

    def diff(
        self, before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]
    ) -> dict[str, dict[str, float]]:
        """{group: {process label: CPU seconds}} spent between the two snapshots (processes
        with the same label are summed)."""
        out: dict[str, dict[str, float]] = {group: {} for group in self.groups}
        for (group, pid), seconds in after.items():
            spent = seconds - before.get((group, pid), 0.0)
            name = self.name(pid)
            out[group][name] = out[group].get(name, 0.0) + max(0.0, spent)
        return out
