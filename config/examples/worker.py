#!/usr/bin/env python3
"""worker.py: a qd external worker with only the Python standard library.

    QD_QUEUE=hooks [QD_URL=http://127.0.0.1:7070] [QD_TOKEN=secret] worker.py COMMAND [ARGS...]

Leases one job at a time from an `executor = { kind = "external" }` queue (a long
poll of QD_WAIT, default 20s), runs COMMAND with the payload on stdin while a thread
heartbeats, then acks (exit 0) or nacks: exit 65 is permanent (dead-lettered now),
any other failure is transient (retried with backoff), with stderr as the error.
"""
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

URL = os.environ.get("QD_URL", "http://127.0.0.1:7070")
TOKEN = os.environ.get("QD_TOKEN")
WAIT = os.environ.get("QD_WAIT", "20s")
ME = os.environ.get("QD_WORKER_ID", f"{socket.gethostname()}-{os.getpid()}")


def api(path, body):
    """POSTs JSON to qd and returns the decoded answer; raises HTTPError on 4xx/5xx."""
    request = urllib.request.Request(
        URL + path, data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json"})
    if TOKEN:
        request.add_header("authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def heartbeat(job, done):
    """Extends the lease every third of it until `done` is set or the lease is lost."""
    while not done.wait(max(job["lease_seconds"] / 3, 0.5)):
        try:
            api(f"/v1/jobs/{job['id']}/heartbeat", {"token": job["token"]})
        except urllib.error.HTTPError as e:
            if e.code == 409:  # the lease is over; our ack would be refused too
                return
        except OSError:
            pass  # qd unreachable for a moment: try again next beat


def work(job, command):
    done = threading.Event()
    threading.Thread(target=heartbeat, args=(job, done), daemon=True).start()
    try:
        run = subprocess.run(command, input=base64.b64decode(job["payload_b64"]),
                             stderr=subprocess.PIPE)
    finally:
        done.set()
    lease = {"token": job["token"]}
    if run.returncode == 0:
        api(f"/v1/jobs/{job['id']}/ack", lease)
    else:
        kind = "permanent" if run.returncode == 65 else "transient"
        error = run.stderr.decode(errors="replace")[-4000:] or f"exit {run.returncode}"
        api(f"/v1/jobs/{job['id']}/nack", {**lease, "kind": kind, "error": error})


def main():
    queue, command = os.environ.get("QD_QUEUE"), sys.argv[1:]
    if not queue or not command:
        sys.exit("usage: QD_QUEUE=name worker.py COMMAND [ARGS...]")
    while True:
        try:
            jobs = api(f"/v1/queues/{queue}/leases",
                       {"worker_id": ME, "max_jobs": 1, "wait": WAIT})["jobs"]
            for job in jobs:
                work(job, command)
        except urllib.error.HTTPError as e:
            print(f"qd answered {e.code}: {e.read().decode(errors='replace')}", file=sys.stderr)
            time.sleep(1)
        except OSError as e:
            print(f"cannot reach qd: {e}", file=sys.stderr)
            time.sleep(1)


if __name__ == "__main__":
    main()
