#!/usr/bin/env bash
# Make sure Postgres and Redis answer at DATABASE_URL / REDIS_URL.
# Order: already running → the machine's own cluster (pg_ctlcluster) → a project-local instance
# under .var/ (the embedded default) → a clear message naming the package to install.
set -euo pipefail
cd "$(dirname "$0")/../.."
VAR="$PWD/.var"
DATABASE_URL="${DATABASE_URL:-postgresql://localhost/notify}"
REDIS_URL="${REDIS_URL:-redis://localhost:6379/0}"
mkdir -p "$VAR"

pg_bin() {
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
  ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1
}

port_of() { # URL default-port
  python3 - "$1" "$2" <<'PY'
import sys, urllib.parse
print(urllib.parse.urlparse(sys.argv[1]).port or sys.argv[2])
PY
}

pg_up() {
  local isready; isready=$(pg_bin pg_isready)
  if [ -n "$isready" ]; then "$isready" -q -h 127.0.0.1 -p "$(port_of "$DATABASE_URL" 5432)" -t 2; return; fi
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)" "$(port_of "$DATABASE_URL" 5432)" 2>/dev/null
}

wait_for() { # name command...
  local name=$1; shift
  for _ in $(seq 1 60); do "$@" && return 0; sleep 0.5; done
  echo "services: $name did not come up" >&2; return 1
}

start_postgres() {
  pg_up && { echo "services: postgres is up"; return; }
  local port; port=$(port_of "$DATABASE_URL" 5432)
  if command -v pg_lsclusters >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # The machine's own cluster, if one is configured on our port and merely stopped.
    local cluster; cluster=$(pg_lsclusters -h 2>/dev/null | awk -v p="$port" '$3 == p && $4 == "down" {print $1, $2; exit}')
    if [ -n "$cluster" ]; then
      echo "services: starting the machine's PostgreSQL cluster $cluster"
      pg_ctlcluster --skip-systemctl-redirect $cluster start || true
      if wait_for postgres pg_up; then return; fi
    fi
  fi
  local initdb pgctl; initdb=$(pg_bin initdb); pgctl=$(pg_bin pg_ctl)
  if [ -z "$initdb" ] || [ -z "$pgctl" ]; then
    echo "services: no PostgreSQL server answers at $DATABASE_URL and none is installed." >&2
    echo "          Install it (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL." >&2
    exit 1
  fi
  local data="$VAR/postgres"
  local run=()
  if [ "$(id -u)" = 0 ]; then  # postgres refuses to run as root
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    run=(runuser -u postgres --)
  fi
  if [ ! -s "$data/PG_VERSION" ]; then
    echo "services: initialising a project-local PostgreSQL in $data"
    mkdir -p "$data"; [ ${#run[@]} -gt 0 ] && chown postgres "$data" "$VAR"
    "${run[@]}" "$initdb" -D "$data" -U "$(id -un)" --auth=trust -E UTF8 >/dev/null
  fi
  echo "services: starting project-local PostgreSQL on 127.0.0.1:$port"
  "${run[@]}" "$pgctl" -D "$data" -l "$data/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $data" start >/dev/null
  wait_for postgres pg_up
}

redis_up() {
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(redis-cli -u "$REDIS_URL" ping 2>/dev/null)" = "PONG" ]; return
  fi
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)" "$(port_of "$REDIS_URL" 6379)" 2>/dev/null
}

start_redis() {
  redis_up && { echo "services: redis is up"; return; }
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "services: no Redis answers at $REDIS_URL and redis-server is not installed." >&2
    echo "          Install it (Debian/Ubuntu: apt-get install redis-server) or set REDIS_URL." >&2
    exit 1
  fi
  mkdir -p "$VAR/redis"
  local port; port=$(port_of "$REDIS_URL" 6379)
  echo "services: starting project-local Redis on 127.0.0.1:$port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "$VAR/redis" --logfile "$VAR/redis/redis.log" --pidfile "$VAR/redis/redis.pid"
  wait_for redis redis_up
}

start_postgres
start_redis
