#!/bin/sh
# worker.sh: a qd external worker in POSIX shell, with curl and jq.
#
#   QD_QUEUE=hooks [QD_URL=http://127.0.0.1:7070] [QD_TOKEN=secret] worker.sh COMMAND [ARGS...]
#
# Leases one job at a time from an `executor = { kind = "external" }` queue (a long
# poll of QD_WAIT, default 20s), runs COMMAND with the payload on stdin while a
# background loop heartbeats, then acks (exit 0) or nacks: exit 65 is permanent
# (dead-lettered now), any other failure is transient (retried with backoff).
# Note: curl's -H puts the token on the command line, visible in ps to local users.
set -u
: "${QD_QUEUE:?set QD_QUEUE to an external queue}"
url=${QD_URL:-http://127.0.0.1:7070}
me=${QD_WORKER_ID:-$(hostname)-$$}
[ $# -gt 0 ] || { echo "usage: QD_QUEUE=name $0 COMMAND [ARGS...]" >&2; exit 64; }

api() { # api PATH JSON: POST, print the response body; fail on an HTTP error
  curl -sS --fail-with-body -X POST "$url$1" -H 'content-type: application/json' \
    ${QD_TOKEN:+-H "authorization: Bearer $QD_TOKEN"} -d "$2"
}

while :; do
  body=$(api "/v1/queues/$QD_QUEUE/leases" \
    "{\"worker_id\":\"$me\",\"max_jobs\":1,\"wait\":\"${QD_WAIT:-20s}\"}") || { sleep 1; continue; }
  job=$(printf '%s' "$body" | jq -c '.jobs[0] // empty')
  [ -n "$job" ] || continue
  id=$(printf '%s' "$job" | jq -r .id)
  token=$(printf '%s' "$job" | jq .token)
  every=$(printf '%s' "$job" | jq '[.lease_seconds / 3 | floor, 1] | max')
  (while sleep "$every"; do api "/v1/jobs/$id/heartbeat" "{\"token\":$token}" >/dev/null; done) &
  beat=$!
  printf '%s' "$job" | jq -r .payload_b64 | base64 -d | "$@"
  rc=$?
  kill "$beat"
  case $rc in
    0) api "/v1/jobs/$id/ack" "{\"token\":$token}" ;;
    65) api "/v1/jobs/$id/nack" "{\"token\":$token,\"kind\":\"permanent\",\"error\":\"exit 65\"}" ;;
    *) api "/v1/jobs/$id/nack" "{\"token\":$token,\"kind\":\"transient\",\"error\":\"exit $rc\"}" ;;
  esac >/dev/null && echo "job $id: exit $rc, reported" >&2
done
