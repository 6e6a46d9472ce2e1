#!/bin/sh
# First start: a cluster in the data volume, its superuser $POSTGRES_USER with password
# $POSTGRES_PASSWORD (scram-sha-256 over the network). Then the server, in the foreground.
set -eu
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
DATA=/var/lib/postgresql/data
if [ ! -s "$DATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" > "$pwfile"
    "$BIN/initdb" -D "$DATA" -U "${POSTGRES_USER:-switchyard}" --pwfile="$pwfile" \
        --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$DATA/pg_hba.conf"
fi
exec "$BIN/postgres" -D "$DATA" -c listen_addresses='*' -k /tmp
