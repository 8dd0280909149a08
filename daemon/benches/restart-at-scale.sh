#!/bin/bash
# Restart time and resident memory with N queued jobs (issue 10: 1,000,000 jobs, <= 1.5 s
# to the first lease served, <= 150 B of RSS per queued job).
# Creates the schema with qd itself, seeds N ready 100-byte jobs with python3's sqlite3
# (seed-ready-jobs.py, beside this script; kept in DIR between runs), then starts qd and
# times exec -> the first lease that returns a job; RSS is read 1 s later.
# Usage: daemon/benches/restart-at-scale.sh path/to/release/qd [N]   (needs curl, python3)
set -eu
QD=$1; N=${2:-1000000}; PORT=${PORT:-17581}
HERE=$(cd "$(dirname "$0")" && pwd)
B=${DIR:-/tmp/qd-restart.$N}
mkdir -p "$B"
cat > "$B/qd.toml" <<TOML
[daemon]
data_dir = "$B/data"
admin_socket = "$B/qctl.sock"
api_listen = "127.0.0.1:$PORT"
metrics_listen = "127.0.0.1:$((PORT+1))"
[defaults]
max_depth = 10000000
[queues.bench]
executor = { kind = "external" }
TOML
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.1; done; echo "qd did not listen"; exit 1; }
if [ ! -f "$B/seeded" ]; then
  rm -rf "$B/data"; mkdir -p "$B/data"
  RUST_LOG=warn "$QD" run --config "$B/qd.toml" > "$B/log" 2>&1 & PID=$!
  wait_port
  awk '/VmRSS/{print $2}' /proc/$PID/status > "$B/rss0"
  kill $PID; wait $PID || true
  python3 "$HERE/seed-ready-jobs.py" "$B/data/qd.db" "$N" && touch "$B/seeded"
fi
T0=$(date +%s%N)
RUST_LOG=warn "$QD" run --config "$B/qd.toml" > "$B/log" 2>&1 & PID=$!
until curl -s -m 2 -X POST -d '{"worker_id":"w","max_jobs":1,"wait":0}' \
    "http://127.0.0.1:$PORT/v1/queues/bench/leases" 2>/dev/null | grep -q '"id"'; do
  kill -0 $PID 2>/dev/null || { echo "qd died:"; cat "$B/log"; exit 1; }
  sleep 0.02
done
T1=$(date +%s%N)
sleep 1
RSS=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
echo "jobs $N: first lease served $(( (T1-T0)/1000000 )) ms after exec; RSS $RSS KiB ($(( (RSS-$(cat "$B/rss0"))*1024/N )) B per queued job over an empty qd)"
kill $PID; wait $PID || true
