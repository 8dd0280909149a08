#!/bin/bash
# qd beside its floor (daemon/examples/floor.rs: HTTP/JSON + a FIFO + a group-committed
# fdatasync'd log, nothing else) and, when it is on the PATH, beanstalkd -f 0 (fsync every
# write), request/reply, P=2 C=2, 100-byte payloads, ROUNDS rounds on one machine, each
# running the three back to back (the order rotates from round to round): end-to-end
# jobs/s, enqueue->ack p50/p99 and server CPU per job (utime + stime from /proc over the
# run / jobs). RATE=2000 paces the producers (the paced target's shape). Needs the
# loadgen of ../shared/bench.
# Usage: LG=path/to/loadgen [RATE=jobs/s] daemon/benches/floor.sh path/to/qd path/to/floor [N] [ROUNDS]
# (build the floor with: cargo build --release -p qd --example floor -> target/release/examples/floor)
set -eu
QD=$1; FLOOR=$2; N=${3:-20000}; ROUNDS=${4:-3}; PORT=${PORT:-17591}; RATE=${RATE:-0}
LG=${LG:?set LG to the loadgen binary built from ../shared/bench/loadgen}
TMP=${TMPDIR:-/tmp}
PID=; D=
cleanup() {
    if [ -n "$PID" ]; then
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
        rm -rf "$TMP/qd-floor-$PID"
    fi
    if [ -n "$D" ]; then rm -rf "$D"; fi
    PID=; D=
}
trap cleanup EXIT
cpu() { awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }
field() { sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p" <<< "$2"; }
ready() {
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0; sleep 0.1; done
    echo "nothing listens on port $PORT after 10 s" >&2; exit 1
}
# Runs the load generator against the server $PID; prints one line for it.
drive() { # name loadgen-target-args...
    local name=$1 t0 t1 report ack
    shift
    ready
    t0=$(cpu "$PID")
    report=$("$LG" "$@" --jobs "$N" --payload 100 --producers 2 --consumers 2 --mode mixed \
        --rate "$RATE" --max-secs 120 2>/dev/null | tail -1)
    t1=$(cpu "$PID")
    ack=$(sed -n 's/.*"lat_enqueue_to_ack_us":{\([^}]*\)}.*/\1/p' <<< "$report")
    printf '%-6s end to end %s jobs/s (all done: %s), enqueue->ack p50 %s ms p99 %s ms, server CPU %d us/job\n' \
        "$name" "$(field consume_jobs_per_s "$report")" "$(field complete "$report")" \
        "$(awk -v u="$(field p50 "$ack")" 'BEGIN {printf "%.1f", u / 1000}')" \
        "$(awk -v u="$(field p99 "$ack")" 'BEGIN {printf "%.1f", u / 1000}')" \
        $(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) / N ))
}
free_port() {
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        echo "port $PORT is already in use (set PORT)" >&2; exit 1
    fi
}
run_qd() {
    D=$(mktemp -d "$TMP/floor.XXXXXX")
    cat > "$D/qd.toml" <<TOML
[daemon]
data_dir = "$D/data"
admin_socket = "$D/qctl.sock"
api_listen = "127.0.0.1:$PORT"
metrics_listen = "127.0.0.1:$((PORT + 1))"
[defaults]
max_depth = 1000000
[queues.bench]
executor = { kind = "external" }
TOML
    RUST_LOG=warn "$QD" run --config "$D/qd.toml" > "$D/log" 2>&1 & PID=$!
    drive qd qd --api "http://127.0.0.1:$PORT" --queue bench --batch 1 --ack-concurrency 1 --wait 1s
}
run_floor() {
    "$FLOOR" "127.0.0.1:$PORT" 2> /dev/null & PID=$!
    drive floor qd --api "http://127.0.0.1:$PORT" --queue bench --batch 1 --ack-concurrency 1 --wait 1s
}
run_bs() {
    D=$(mktemp -d "$TMP/floor.XXXXXX")
    beanstalkd -l 127.0.0.1 -p "$PORT" -b "$D" -f 0 & PID=$!
    drive bs-f0 beanstalkd --addr "127.0.0.1:$PORT" --pipeline 1
}
servers=(qd floor)
command -v beanstalkd > /dev/null && servers+=(bs)
for round in $(seq "$ROUNDS"); do
    echo "round $round"
    for i in "${!servers[@]}"; do
        free_port
        "run_${servers[(i + round - 1) % ${#servers[@]}]}"
        cleanup
    done
done
