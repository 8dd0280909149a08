#!/bin/bash
# qd beside its floor (daemon/examples/floor.rs: HTTP/JSON + a FIFO + a group-committed
# fdatasync'd log, nothing else) and, when it is on the PATH, beanstalkd -f 0 (fsync every
# write), request/reply, P=2 C=2, 100-byte payloads, interleaved ROUNDS times on one
# machine: end-to-end jobs/s and server CPU per job (utime + stime from /proc over the
# run / jobs). Needs the loadgen of ../shared/bench.
# Usage: LG=path/to/loadgen daemon/benches/floor.sh path/to/qd path/to/floor [N] [ROUNDS]
# (build the floor with: cargo build --release -p qd --example floor -> target/release/examples/floor)
set -eu
QD=$1; FLOOR=$2; N=${3:-20000}; ROUNDS=${4:-3}; PORT=${PORT:-17591}
LG=${LG:?set LG to the loadgen binary built from ../shared/bench/loadgen}
cpu() { awk '{sub(/^.*\) /, ""); print $12 + $13}' /proc/$1/stat; }
drive() { # name pid loadgen-target-args...
    local name=$1 pid=$2 t0 t1 report
    shift 2
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    t0=$(cpu $pid)
    report=$($LG "$@" --jobs $N --payload 100 --producers 2 --consumers 2 --mode mixed --max-secs 120 2>/dev/null | tail -1)
    t1=$(cpu $pid)
    printf '%-10s end to end %s jobs/s (all done: %s), server CPU %d us/job\n' "$name" \
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
    HTTP="--api http://127.0.0.1:$PORT --queue bench --batch 1 --ack-concurrency 1 --wait 1s"
    drive qd $PID qd $HTTP
    kill $PID; wait $PID 2>/dev/null || true
    "$FLOOR" 127.0.0.1:$PORT 2> $D/floor.log & PID=$!
    drive floor $PID qd $HTTP
    kill $PID; wait $PID 2>/dev/null || true
    rm -rf /tmp/qd-floor-$PID
    if command -v beanstalkd > /dev/null; then
        mkdir $D/binlog
        beanstalkd -l 127.0.0.1 -p $PORT -b $D/binlog -f 0 & PID=$!
        drive bs-f0 $PID beanstalkd --addr 127.0.0.1:$PORT --pipeline 1
        kill $PID; wait $PID 2>/dev/null || true
    fi
    rm -rf $D
done
