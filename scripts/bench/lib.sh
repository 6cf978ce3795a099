# shellcheck shell=bash
# What the benchmarks in scripts/bench/ share; each sources it first
# (`source "$(dirname "$0")/lib.sh"`), it is never run on its own. It sets the shell's
# options, moves to the repository's root, and defines:
#   BROKERS            $KAFKA_BOOTSTRAP_SERVERS, or 127.0.0.1:9092 (`scripts/kafka start`)
#   RELEASE            the release build's folder ($CARGO_TARGET_DIR or target)
#   build_release ARGS `cargo build --release --locked -q ARGS`
#   need_tools T...    exits naming the first tool of T... not on the PATH
#   bench_workdir [T]  WORK, a fresh temporary folder (mktemp -d T); at exit the
#                      processes in PIDS get BENCH_KILL_SIGNAL (TERM), the script's own
#                      `on_exit` runs if it defines one, and WORK is removed
#   wait_port PORT     waits until 127.0.0.1:PORT accepts a connection (10 s)
#   free_port          a local port nobody listens on
#   cpu_seconds PID... CPU seconds (user + system) of each pid, from /proc, one a line
#   get TEXT KEY       the value of KEY in TEXT's `key=value` words
#   ratio A B [D] [N]  A / B with D decimals (2), or N (-) unless both are positive
#   per_m CPU EVENTS   CPU seconds per million events
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

BROKERS="${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
RELEASE="${CARGO_TARGET_DIR:-target}/release"
PIDS=()

build_release() {
  cargo build --release --locked -q "$@"
}

need_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$(basename "$0"): $tool missing (apt-get install -y $tool)" >&2; exit 1; }
  done
}

bench_workdir() {
  WORK="$(mktemp -d "$@")"
  trap bench_cleanup EXIT
}

bench_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -"${BENCH_KILL_SIGNAL:-TERM}" "$p" 2>/dev/null || true; done
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  rm -rf "$WORK"
}

wait_port() {
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not open" >&2
  return 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cpu_seconds() {
  local tck p
  tck=$(getconf CLK_TCK)
  for p in "$@"; do
    awk -v t="$tck" '{printf "%.2f\n", ($14 + $15) / t}' "/proc/$p/stat" 2>/dev/null || echo 0
  done
}

get() { echo "$1" | tr ' ' '\n' | awk -F= -v k="$2" '$1==k {print $2}'; }

ratio() {
  awk -v a="$1" -v b="$2" -v d="${3:-2}" -v none="${4:--}" \
    'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.*f", d, a / b; else print none }'
}

per_m() { awk -v c="$1" -v t="$2" 'BEGIN { printf "%.2f", c * 1000000 / t }'; }
