#!/bin/bash
# qd beside its floor (daemon/examples/floor.rs: HTTP/JSON + a FIFO + a group-committed
# fdatasync'd log, nothing else), request/reply, P=2 C=2, 100-byte payloads, interleaved
# ROUNDS times on one machine: end-to-end jobs/s and server CPU per job (utime + stime
# from /proc over the run / jobs). Needs the loadgen of ../shared/bench.
# Usage: LG=path/to/loadgen daemon/benches/floor.sh path/to/qd path/to/floor [N] [ROUNDS]
# (build the floor with: cargo build --release -p qd --example floor -> target/release/examples/floor)
set -eu
QD=$1; FLOOR=$2; N=${3:-20000}; ROUNDS=${4:-3}; PORT=${PORT:-17591}
LG=${LG:?set LG to the loadgen binary built from ../shared/bench/loadgen}
cpu() { awk '{sub(/^.*\) /, ""); print $12 + $13}' /proc/$1/stat; }
drive() { # name pid
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    local t0 t1 report
    t0=$(cpu $2)
    report=$($LG qd --api http://127.0.0.1:$PORT --queue bench --jobs $N --payload 100 --producers 2 --consumers 2 \
        --batch 1 --ack-concurrency 1 --wait 1s --mode mixed --max-secs 120 2>/dev/null | tail -1)
    t1=$(cpu $2)
    printf '%-6s end to end %s jobs/s (all done: %s), server CPU %d us/job\n' "$1" \
        "$(sed -n 's/.*"consume_jobs_per_s":\([0-9.]*\).*/\1/p' <<< "$report")" \
        "$(sed -n 's/.*"complete":\([a-z]*\).*/\1/p' <<< "$report")" \
        $(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) / N ))
}
for round in $(seq "$ROUNDS"); do
    echo "round $round"
    D=$(mktemp -d /tmp/floor.XXXXXX)
    cat > $D/qd.toml <<TOML
[daemon]
data_dir = "$D/data"
admin_socket = "$D/qctl.sock"
api_listen = "127.0.0.1:$PORT"
metrics_listen = "127.0.0.1:$((PORT+1))"
[defaults]
max_depth = 1000000
[queues.bench]
executor = { kind = "external" }
TOML
    RUST_LOG=warn "$QD" run --config $D/qd.toml > $D/log 2>&1 & PID=$!
    drive qd $PID
    kill $PID; wait $PID 2>/dev/null || true
    "$FLOOR" 127.0.0.1:$PORT 2> $D/floor.log & PID=$!
    drive floor $PID
    kill $PID; wait $PID 2>/dev/null || true
    rm -rf $D /tmp/qd-floor-$PID
done
