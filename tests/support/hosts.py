"""Host names that resolve to what a test says, for the processes it starts, without touching
/etc/hosts: cwrap's nss_wrapper (Debian's libnss-wrapper, installed by `make test`), preloaded
into a child, answers getaddrinfo from the hosts file NSS_WRAPPER_HOSTS names and passes
other names on to the system resolver. The child runs its production resolver unchanged.

The file is re-read when its modification time changes: each write replaces it whole and
moves the time forward by a second (nss_wrapper compares whole seconds)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

INSTALL = "apt-get install libnss-wrapper (make test installs it as root)"


def nss_wrapper_library() -> str:
    found = sorted(
        glob.glob("/usr/lib/*/libnss_wrapper.so") + glob.glob("/usr/lib/libnss_wrapper.so")
    )
    if not found:
        raise RuntimeError(f"libnss_wrapper.so is missing: {INSTALL}")
    return found[0]


class HostsFile:
    """A hosts file served to children through nss_wrapper: `env` for them, `set` to change
    what a name resolves to (every address of a name is one A record)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[str, list[str]] = {}
        self._stamp = 0
        self.env = {"LD_PRELOAD": nss_wrapper_library(), "NSS_WRAPPER_HOSTS": str(path)}
        self._write()

    def set(self, name: str, *addresses: str) -> None:
        self.names[name] = list(addresses)
        self._write()

    def _write(self) -> None:
        lines = [f"{a} {name}\n" for name, addresses in self.names.items() for a in addresses]
        scratch = self.path.with_suffix(".new")
        scratch.write_text("".join(lines) or "# nothing\n")
        now = int(os.path.getmtime(scratch))
        self._stamp = max(self._stamp + 1, now)
        os.utime(scratch, (self._stamp, self._stamp))
        os.replace(scratch, self.path)
