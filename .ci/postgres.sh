#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the tests and print its URL (for
# PENCIL_TEST_DATABASE_URL). Debian's `postgresql` package provides the binaries; the
# server refuses to run as root, so as root it runs as the `postgres` user.
#
#   export PENCIL_TEST_DATABASE_URL=$(bash .ci/postgres.sh /tmp/pencil-pg)
#   ...
#   bash .ci/postgres.sh /tmp/pencil-pg stop
#
# Trust authentication on 127.0.0.1 only, and fsync off: a test server, never a real one.
set -euo pipefail

dir=${1:-/tmp/pencil-pg}
action=${2:-start}
port=${PENCIL_TEST_PG_PORT:-54329}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
  echo "no PostgreSQL under /usr/lib/postgresql: apt-get install postgresql" >&2
  exit 1
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi
}

if [ "$action" = stop ]; then
  as_owner "'$bin/pg_ctl' -D '$dir/data' -m fast stop" >/dev/null
  exit 0
fi

if [ -f "$dir/data/postmaster.pid" ]; then
  as_owner "'$bin/pg_ctl' -D '$dir/data' -m immediate stop" >/dev/null 2>&1 || true
fi
rm -rf "$dir"
mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
as_owner "'$bin/initdb' -D '$dir/data' -U pencil --auth=trust -E UTF8 >'$dir/initdb.log'"
as_owner "'$bin/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -t 60 \
  -o \"-p $port -k '$dir' -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200\" start" >/dev/null
as_owner "'$bin/createdb' -h 127.0.0.1 -p $port -U pencil pencil"
echo "postgresql://pencil@127.0.0.1:$port/pencil"
