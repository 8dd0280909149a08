#!/bin/sh
# demo-job.sh: the job the example queues in qd.toml run. Shows how a command
# executor talks to qd: the payload arrives on stdin, the job's identity in
# QD_* environment variables, and the exit code says what happened.
#
#   payload contains "fail"    -> message on stderr, exit 75 (EX_TEMPFAIL: transient, retried),
#                                 until the file /tmp/qd-demo-fixed exists ("the fix is deployed")
#   payload contains "bad"     -> message on stderr, exit 65 (EX_DATAERR: permanent, dead-lettered)
#   payload contains "sleep N" -> sleeps N seconds, then succeeds
#   anything else              -> prints "done $QD_JOB_ID attempt $QD_ATTEMPT", exit 0
set -eu

payload=$(cat)

case "$payload" in
*fail*)
    if [ ! -e /tmp/qd-demo-fixed ]; then
        echo "demo-job: payload asked to fail; try again later" >&2
        exit 75
    fi
    ;;
*bad*)
    echo "demo-job: payload is bad data; retrying will not help" >&2
    exit 65
    ;;
esac

seconds=$(printf '%s\n' "$payload" | sed -n 's/.*sleep \([0-9][0-9]*\).*/\1/p' | head -n 1)
if [ -n "$seconds" ]; then
    sleep "$seconds"
fi

echo "done ${QD_JOB_ID:-unknown} attempt ${QD_ATTEMPT:-unknown}"
