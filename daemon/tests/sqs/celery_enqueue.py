"""Enqueues tasks 0..N-1 of celery_tasks.record with .delay() (argv[1] = N, argv[2] = first)."""

import sys

from celery_tasks import record

first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
for n in range(first, first + int(sys.argv[1])):
    record.delay(n)
print("enqueued", sys.argv[1])
