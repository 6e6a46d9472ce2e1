#!/usr/bin/env bash
# PostgreSQL's server binaries for the stored-responses tests, which start throwaway clusters
# of their own (tests/support/postgres.py): Debian's package, installed when missing. It
# needs root; without it, this says what to run. No cluster of the system's is created or
# started (create_main_cluster = false): the tests need the binaries only.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL's server binaries (initdb, pg_ctl) are missing; the tests run a real" >&2
    echo "server: sudo apt-get install -y postgresql (or run make postgres as root)" >&2
    exit 1
fi
echo "installing Debian's postgresql (server binaries for the tests)"
mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/switchyard.conf
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
