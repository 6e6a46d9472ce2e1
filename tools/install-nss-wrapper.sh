#!/usr/bin/env bash
# cwrap's nss_wrapper for the end-to-end tests of names with several addresses
# (tests/support/hosts.py): preloaded into a test's process, it answers getaddrinfo from a
# hosts file of the test's own, so no test edits /etc/hosts. Debian's package, installed when
# missing; it needs root, without it this says what to run.
set -euo pipefail
if compgen -G "/usr/lib/*/libnss_wrapper.so" >/dev/null || [ -e /usr/lib/libnss_wrapper.so ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "libnss_wrapper.so is missing; the tests of replicas behind one name use it:" >&2
    echo "sudo apt-get install -y libnss-wrapper (or run make nss-wrapper as root)" >&2
    exit 1
fi
echo "installing Debian's libnss-wrapper (host names for the tests)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnss-wrapper >/dev/null
