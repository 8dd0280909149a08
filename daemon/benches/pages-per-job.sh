#!/bin/bash
# Bytes qd writes to its database files (qd.db + qd.db-wal) per job, enqueue -> lease -> ack,
# counted with strace on pwrite64/write. Needs strace and the loadgen of ../shared/bench.
# Usage: LG=path/to/loadgen daemon/benches/pages-per-job.sh path/to/qd [N]
set -eu
QD=$1; N=${2:-2000}; PORT=${PORT:-17591}
LG=${LG:?set LG to the loadgen binary built from ../shared/bench/loadgen}
D=$(mktemp -d /tmp/hpm.XXXXXX)
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
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
strace -f -y -qq -e trace=pwrite64,write -e signal=none -o $D/trace -p $PID & ST=$!
sleep 1
$LG qd --api http://127.0.0.1:$PORT --queue bench --jobs $N --payload 100 --producers 2 --consumers 2 --batch 1 --ack-concurrency 1 --wait 1s --mode mixed --max-secs 120 --label m | tail -1
kill $ST; wait $ST 2>/dev/null || true
grep -E 'qd\.db' $D/trace | awk -v n=$N '{ r=$NF; if (r ~ /^[0-9]+$/) { b+=r; c++ } } END { printf "db+wal bytes per job: %d, db writes per job: %.2f\n", b/n, c/n }'
grep -E 'qd\.db-wal' $D/trace | awk -v n=$N '{ r=$NF; if (r ~ /^[0-9]+$/) { b+=r } } END { printf "  of which WAL bytes per job: %d (%.2f pages)\n", b/n, b/n/4120 }'
kill $PID; wait $PID 2>/dev/null || true; rm -rf $D
