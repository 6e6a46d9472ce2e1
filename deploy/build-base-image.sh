#!/usr/bin/env bash
# A Python base image built from Debian packages alone, for sites where no image registry is
# reachable (the Dockerfile's default base, python:3.11-slim, comes from Docker Hub):
#
#   deploy/build-base-image.sh [TAG]          # default tag: switchyard-base:bookworm
#   docker build -f deploy/Dockerfile --build-arg BASE_IMAGE=switchyard-base:bookworm -t switchyard:local .
#   SWITCHYARD_BASE_IMAGE=switchyard-base:bookworm docker compose -f deploy/docker-compose.yml build
#
# debootstrap (minbase) installs python3, python3-venv and ca-certificates from the Debian
# mirror into a folder, which becomes the image through `docker import`. Needs root, a running
# Docker daemon, and debootstrap (installed from Debian's packages when missing).
#
# Environment: SUITE (bookworm: Python 3.11), MIRROR (the Debian mirror; default: the one
# this machine's apt uses, else deb.debian.org), KEEP_CACHE=1 to keep the .deb download cache
# in /var/cache/switchyard-debootstrap for the next run.
set -euo pipefail

TAG=${1:-switchyard-base:bookworm}
SUITE=${SUITE:-bookworm}
DOCKER=${DOCKER:-docker}

if [[ $(id -u) != 0 ]]; then
    echo "build-base-image: debootstrap needs root" >&2
    exit 2
fi

if [[ -z ${MIRROR:-} ]]; then
    # The mirror apt already reaches (deb822 .sources or one-line .list), else the default.
    MIRROR=$(grep -hoE '^(URIs:|deb)[[:space:]]+https?://[^[:space:]]+/debian/?([[:space:]]|$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
        | awk '{print $2}' | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

if ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

root=$(mktemp -d /tmp/switchyard-rootfs.XXXXXX)
cleanup() { rm -rf --one-file-system "$root"; }
trap cleanup EXIT

cache_args=()
if [[ ${KEEP_CACHE:-0} == 1 ]]; then
    mkdir -p /var/cache/switchyard-debootstrap
    cache_args=(--cache-dir=/var/cache/switchyard-debootstrap)
fi

echo "build-base-image: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "${cache_args[@]}" "$SUITE" "$root" "$MIRROR"

# What an image does not need: package caches and lists, docs, man pages, other locales.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.UTF-8' -exec rm -rf {} +

tar --numeric-owner -C "$root" -c . | "$DOCKER" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$TAG" >/dev/null
python_version=$("$DOCKER" run --rm "$TAG" python3 -c 'import sys; print(sys.version.split()[0])')
echo "build-base-image: $TAG ($(
    "$DOCKER" image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1 / 1e6}'
), Python $python_version)"
