#!/usr/bin/env bash
# run-headrace.sh — start headrace on a free 127.0.0.1 port with a fresh data directory, run
# kbench.py against it, stop headrace (SIGTERM, clean shutdown), print kbench's JSON line.
# Same contract as ../shared/bench/run-peer.sh:
#
#   ./run-headrace.sh [kbench args...]     e.g. ./run-headrace.sh --records 500000 --acks all
#   ./run-headrace.sh -- CMD [ARGS...]     run any command; $BOOTSTRAP and $BROKER_PID exported
#
# Env: BENCH_SCRATCH (default /tmp/bench-eval), KBENCH (default ../shared/bench/kbench.py),
#      PYTHON (default the repository's .venv python), TIME_V=1 wraps the client in time -v,
#      HEADRACE_OVERRIDES: extra "key=value key=value" broker overrides,
#      HEADRACE_EVENT_LOOP=uvloop runs the broker on uvloop (default: asyncio's own loop).
# Exit code is kbench's. Only 127.0.0.1 is used.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
SCRATCH="${BENCH_SCRATCH:-/tmp/bench-eval}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
KBENCH="${KBENCH:-$REPO/../shared/bench/kbench.py}"
mkdir -p "$SCRATCH"

PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
DATA="$(mktemp -d "$SCRATCH/headrace-data-$PORT.XXXXXX")"
LOG="$SCRATCH/headrace-$PORT.log"
OVERRIDES=(--override "listeners=PLAINTEXT://127.0.0.1:$PORT" --override "log.dirs=$DATA")
for kv in ${HEADRACE_OVERRIDES:-}; do OVERRIDES+=(--override "$kv"); done

"$PY" -m headrace.cli.main broker "${OVERRIDES[@]}" >"$LOG" 2>&1 &
BPID=$!
cleanup() {
  if kill -0 "$BPID" 2>/dev/null; then
    kill "$BPID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$BPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BPID" 2>/dev/null || true
  fi
  wait "$BPID" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT INT TERM

for i in $(seq 300); do
  if "$PY" -c "import socket; socket.create_connection(('127.0.0.1',$PORT),0.2).close()" 2>/dev/null; then break; fi
  if ! kill -0 "$BPID" 2>/dev/null; then echo "run-headrace: broker exited early, log:" >&2; cat "$LOG" >&2; exit 3; fi
  sleep 0.1
  [[ $i == 300 ]] && { echo "run-headrace: not listening on $PORT after 30s" >&2; exit 3; }
done
echo "run-headrace: headrace pid $BPID on 127.0.0.1:$PORT data=$DATA (log $LOG)" >&2

export BOOTSTRAP="127.0.0.1:$PORT" BROKER_PID="$BPID"
if [[ "${1:-}" == "--" ]]; then
  shift; CMD=("$@"); set --
else
  CMD=("$PY" "$KBENCH" --bootstrap "$BOOTSTRAP" --broker-pid "$BPID" --label "headrace")
fi
if [[ "${TIME_V:-0}" == 1 ]]; then CMD=(/usr/bin/time -v "${CMD[@]}"); fi
set +e
"${CMD[@]}" "$@"
RC=$?
set -e
exit $RC
