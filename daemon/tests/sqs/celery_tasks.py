"""A Celery app on Kombu's SQS transport pointed at qd (daemon/tests/sqs.rs).

QD_SQS_ENDPOINT is qd's API, QD_DONE_DIR where each task run leaves a file.
"""

import os
import time
from urllib.parse import urlparse

from celery import Celery

endpoint = urlparse(os.environ["QD_SQS_ENDPOINT"])
DONE = os.environ["QD_DONE_DIR"]

app = Celery("qd_celery", broker=f"sqs://test:test@{endpoint.hostname}:{endpoint.port}")
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": 10,
        "wait_time_seconds": 1,
        "polling_interval": 0.2,
        "predefined_queues": {
            "celery": {
                "url": f"{os.environ['QD_SQS_ENDPOINT']}/000000000000/celery",
                "access_key_id": "test",
                "secret_access_key": "test",
            }
        },
    },
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue="celery",
)


@app.task
def record(n):
    time.sleep(0.1)
    with open(os.path.join(DONE, f"{n}.{os.getpid()}.{time.monotonic_ns()}"), "w") as f:
        f.write(str(n))
    return n
