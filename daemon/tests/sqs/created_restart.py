"""A queue made with CreateQueue survives a restart of qd (even kill -9).

QD_PHASE=create: creates `durable` with attributes, tags and a redrive policy naming
`durable-dlq`, and sends one message; QD_PHASE=check (after qd restarted): the queues, their
attributes, tags and the message are all still there, and the message move task started
before is forgotten. QD_SQS_ENDPOINT names qd.
"""

import json
import os

import boto3

ENDPOINT = os.environ["QD_SQS_ENDPOINT"]
ARN = "arn:aws:sqs:us-east-1:000000000000:"
ATTRIBUTES = {
    "VisibilityTimeout": "17",
    "DelaySeconds": "0",
    "MessageRetentionPeriod": "7200",
    "ReceiveMessageWaitTimeSeconds": "3",
    "MaximumMessageSize": "4096",
}
POLICY = {"deadLetterTargetArn": ARN + "durable-dlq", "maxReceiveCount": 7}

sqs = boto3.client(
    "sqs",
    endpoint_url=ENDPOINT,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)

if os.environ["QD_PHASE"] == "create":
    sqs.create_queue(QueueName="durable-dlq")
    url = sqs.create_queue(
        QueueName="durable",
        Attributes=dict(ATTRIBUTES, RedrivePolicy=json.dumps(POLICY)),
        tags={"owner": "billing"},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    sqs.start_message_move_task(SourceArn=ARN + "durable-dlq")
    tasks = sqs.list_message_move_tasks(SourceArn=ARN + "durable-dlq")["Results"]
    assert len(tasks) == 1, tasks
else:
    url = sqs.get_queue_url(QueueName="durable")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    for key, value in ATTRIBUTES.items():
        assert attrs[key] == value, (key, attrs)
    assert json.loads(attrs["RedrivePolicy"]) == POLICY, attrs
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"owner": "billing"}
    dlq = sqs.get_queue_url(QueueName="durable-dlq")["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    # The queue's ReceiveMessageWaitTimeSeconds makes this a long poll.
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert [m["Body"] for m in got] == ["kept"], got
    assert sqs.create_queue(QueueName="durable", Attributes=ATTRIBUTES)["QueueUrl"] == url
    # Move tasks live in the memory of the node that ran them: a restart forgets
    # them, and a new one starts at once.
    assert sqs.list_message_move_tasks(SourceArn=ARN + "durable-dlq")["Results"] == []
    handle = sqs.start_message_move_task(SourceArn=ARN + "durable-dlq")["TaskHandle"]
    assert handle
print("OK")
