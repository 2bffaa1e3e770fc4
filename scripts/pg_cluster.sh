#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and benchmarks.
#
#   scripts/pg_cluster.sh start DIR   create and start a cluster in DIR (a new folder), print its DSN
#   scripts/pg_cluster.sh stop DIR    stop it and delete DIR
#
# The server listens on 127.0.0.1 only, on a free port, with trust authentication for the
# superuser `postgres`, fsync off (the data is thrown away) and its socket inside DIR. It uses
# the newest PostgreSQL under /usr/lib/postgresql (installed with apt-get when none is there),
# or the one whose bin folder $PG_BIN names. initdb refuses to run as root: as root, the
# cluster runs as the `postgres` user in a folder it owns. Usage in a shell script:
#
#   dir=$(mktemp -d)/pg; dsn=$(scripts/pg_cluster.sh start "$dir")
#   trap 'scripts/pg_cluster.sh stop "$dir"' EXIT
#   export EVENTLOG_TEST_POSTGRES="$dsn"
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$2

find_bin() {
    if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$found" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "pg_cluster: no PostgreSQL found, installing it with apt-get" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
        found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    fi
    [ -n "$found" ] || { echo "pg_cluster: no PostgreSQL server found (set PG_BIN)" >&2; exit 1; }
    echo "$found"
}

# Run a command as the cluster's owner: postgres when we are root, else ourselves.
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "$action" in
start)
    bin=$(find_bin)
    [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || { echo "pg_cluster: $dir exists and is not empty" >&2; exit 1; }
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
        chown postgres "$dir"
        # The user must reach DIR: open the folders above it for traversal (mktemp makes them 0700).
        parent=$(dirname "$(readlink -f "$dir")")
        while [ "$parent" != / ]; do chmod o+x "$parent" 2>/dev/null || true; parent=$(dirname "$parent"); done
    fi
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    for attempt in 1 2 3 4 5; do
        port=$(free_port)
        if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
            -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories='$dir' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
            >/dev/null; then
            echo "$port" >"$dir/port"
            echo "postgresql://postgres@127.0.0.1:$port/postgres"
            exit 0
        fi
        sleep 0.5  # the port was taken meanwhile: try another
    done
    cat "$dir/server.log" >&2
    exit 1
    ;;
stop)
    [ -d "$dir/data" ] || exit 0
    bin=$(find_bin)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*) usage ;;
esac
