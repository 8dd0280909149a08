"""SQS compatibility suite: an unmodified botocore client against a running qd.

Run by daemon/tests/sqs.rs, once with current boto3/botocore (the AWS JSON 1.0
protocol) and once with botocore 1.34.89 (the query protocol). The environment
names the endpoint (QD_SQS_ENDPOINT) and the protocol the client must be using
(QD_SQS_PROTOCOL: json or query), so a client that silently picked the other
protocol fails instead of passing.

Queues (from the test's config): `jobs` (external, lease 30s, backoff 10ms,
max_attempts 100), `other` (external), `cmd` (run by qd's own workers).
"""

import base64
import hashlib
import json
import os
import struct
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import botocore.session
from botocore.config import Config

ENDPOINT = os.environ["QD_SQS_ENDPOINT"]
PROTOCOL = os.environ["QD_SQS_PROTOCOL"]
ACCOUNT = "000000000000"


def client():
    session = botocore.session.get_session()
    return session.create_client(
        "sqs",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


def md5_of_attributes(attrs):
    """SQS's MD5OfMessageAttributes, written from the AWS documentation."""
    buf = b""

    def framed(b):
        return struct.pack("!I", len(b)) + b

    for name in sorted(attrs):
        a = attrs[name]
        buf += framed(name.encode()) + framed(a["DataType"].encode())
        if "BinaryValue" in a:
            value = a["BinaryValue"]
            if isinstance(value, str):
                value = base64.b64decode(value)
            buf += b"\x02" + framed(value)
        else:
            buf += b"\x01" + framed(a["StringValue"].encode())
    return hashlib.md5(buf).hexdigest()


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


class Sqs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sqs = client()
        cls.url = cls.sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
        cls.other = cls.sqs.get_queue_url(QueueName="other")["QueueUrl"]

    def setUp(self):
        self.drain(self.url)
        self.drain(self.other)

    def drain(self, url):
        while True:
            got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
            msgs = got.get("Messages", [])
            if not msgs:
                return
            for m in msgs:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def error_code(self, ctx):
        return ctx.exception.response["Error"]["Code"]

    # -- the protocol under test -------------------------------------------------

    def test_the_client_speaks_the_protocol_under_test(self):
        self.assertEqual(self.sqs.meta.service_model.protocol, PROTOCOL)

    # -- queues ------------------------------------------------------------------

    def test_queue_urls_and_listing(self):
        self.assertEqual(self.url, f"{ENDPOINT}/{ACCOUNT}/jobs")
        urls = self.sqs.list_queues()["QueueUrls"]
        self.assertIn(self.url, urls)
        self.assertIn(self.other, urls)
        self.assertEqual(self.sqs.list_queues(QueueNamePrefix="oth")["QueueUrls"], [self.other])
        page = self.sqs.list_queues(MaxResults=1)
        self.assertEqual(len(page["QueueUrls"]), 1)
        rest = self.sqs.list_queues(MaxResults=1000, NextToken=page["NextToken"])
        self.assertNotIn(page["QueueUrls"][0], rest["QueueUrls"])
        self.assertNotIn("QueueUrls", self.sqs.list_queues(QueueNamePrefix="zzz"))

    def test_unknown_queue_is_queue_does_not_exist(self):
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist) as ctx:
            self.sqs.get_queue_url(QueueName="nope")
        self.assertEqual(self.error_code(ctx), "AWS.SimpleQueueService.NonExistentQueue")
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.send_message(QueueUrl=f"{ENDPOINT}/{ACCOUNT}/nope", MessageBody="x")
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.send_message(QueueUrl=f"{ENDPOINT}/111111111111/jobs", MessageBody="x")

    def test_create_queue_of_a_configured_queue_answers_its_url(self):
        self.assertEqual(self.sqs.create_queue(QueueName="jobs")["QueueUrl"], self.url)
        with self.assertRaises(self.sqs.exceptions.QueueNameExists):
            self.sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "5"})

    def test_queue_attributes(self):
        self.sqs.send_message(QueueUrl=self.url, MessageBody="a")
        self.sqs.send_message(QueueUrl=self.url, MessageBody="b", DelaySeconds=60)
        got = self.sqs.receive_message(QueueUrl=self.url)
        self.sqs.send_message(QueueUrl=self.url, MessageBody="c")
        attrs = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["All"])["Attributes"]
        self.assertEqual(attrs["ApproximateNumberOfMessages"], "1")
        self.assertEqual(attrs["ApproximateNumberOfMessagesNotVisible"], "1")
        self.assertEqual(attrs["ApproximateNumberOfMessagesDelayed"], "1")
        self.assertEqual(attrs["VisibilityTimeout"], "30")
        self.assertEqual(attrs["QueueArn"], f"arn:aws:sqs:us-east-1:{ACCOUNT}:jobs")
        self.assertEqual(attrs["MaximumMessageSize"], str(1 << 20))
        one = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])
        self.assertEqual(list(one["Attributes"]), ["QueueArn"])
        with self.assertRaises(self.sqs.exceptions.InvalidAttributeName):
            self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["Bogus"])
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=got["Messages"][0]["ReceiptHandle"])
        self.sqs.purge_queue(QueueUrl=self.url)

    # -- messages ----------------------------------------------------------------

    def test_send_receive_delete_with_attributes_and_md5s(self):
        attrs = {
            "s": {"DataType": "String", "StringValue": "héllo"},
            "n": {"DataType": "Number.int", "StringValue": "42"},
            "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        }
        body = "line one\r\nline two <&> \u00e9 \U0001f642"
        sent = self.sqs.send_message(QueueUrl=self.url, MessageBody=body, MessageAttributes=attrs)
        self.assertEqual(sent["MD5OfMessageBody"], md5(body))
        self.assertEqual(sent["MD5OfMessageAttributes"], md5_of_attributes(attrs))
        before = int(time.time() * 1000)
        got = self.sqs.receive_message(
            QueueUrl=self.url,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )["Messages"]
        self.assertEqual(len(got), 1)
        m = got[0]
        self.assertEqual(m["MessageId"], sent["MessageId"])
        self.assertEqual(m["Body"], body)
        self.assertEqual(m["MD5OfBody"], md5(body))
        self.assertEqual(m["MD5OfMessageAttributes"], md5_of_attributes(attrs))
        self.assertEqual(m["MessageAttributes"]["b"]["BinaryValue"], b"\x00\x01\xff")
        self.assertEqual(m["MessageAttributes"]["n"]["StringValue"], "42")
        self.assertEqual(m["Attributes"]["ApproximateReceiveCount"], "1")
        sent_at = int(m["Attributes"]["SentTimestamp"])
        self.assertLessEqual(abs(sent_at - before), 60_000)
        first = int(m["Attributes"]["ApproximateFirstReceiveTimestamp"])
        self.assertGreaterEqual(first, sent_at)
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))

    def test_message_attribute_names_select_and_the_md5_covers_the_selection(self):
        attrs = {
            "a.x": {"DataType": "String", "StringValue": "1"},
            "b": {"DataType": "String", "StringValue": "2"},
        }
        self.sqs.send_message(QueueUrl=self.url, MessageBody="sel", MessageAttributes=attrs)
        m = self.sqs.receive_message(QueueUrl=self.url, MessageAttributeNames=["a.*"])["Messages"][0]
        self.assertEqual(list(m["MessageAttributes"]), ["a.x"])
        self.assertEqual(m["MD5OfMessageAttributes"], md5_of_attributes({"a.x": attrs["a.x"]}))
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def test_deduplication_id_and_group_id(self):
        a = self.sqs.send_message(QueueUrl=self.url, MessageBody="once", MessageDeduplicationId="k-1", MessageGroupId="tenant-a")
        b = self.sqs.send_message(QueueUrl=self.url, MessageBody="once", MessageDeduplicationId="k-1", MessageGroupId="tenant-a")
        self.assertEqual(a["MessageId"], b["MessageId"])
        got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0]["Attributes"]["MessageGroupId"], "tenant-a")
        self.assertEqual(got[0]["Attributes"]["MessageDeduplicationId"], "k-1")
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=got[0]["ReceiptHandle"])
        with self.assertRaises(self.sqs.exceptions.ClientError) as ctx:
            self.sqs.send_message(QueueUrl=self.url, MessageBody="x", MessageGroupId="no spaces")
        self.assertEqual(self.error_code(ctx), "InvalidParameterValue")

    def test_batches(self):
        entries = [{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(9)]
        entries.append({"Id": "bad", "MessageBody": "nul \x00 here"})
        sent = self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
        self.assertEqual(len(sent["Successful"]), 9)
        self.assertEqual([f["Id"] for f in sent["Failed"]], ["bad"])
        self.assertEqual(sent["Failed"][0]["Code"], "InvalidMessageContents")
        self.assertTrue(sent["Failed"][0]["SenderFault"])
        for s in sent["Successful"]:
            self.assertEqual(s["MD5OfMessageBody"], md5("m" + s["Id"][1:]))
        got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10)["Messages"]
        self.assertEqual(sorted(m["Body"] for m in got), sorted(f"m{i}" for i in range(9)))
        dels = [{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        dels.append({"Id": "junk", "ReceiptHandle": "not-a-handle"})
        deleted = self.sqs.delete_message_batch(QueueUrl=self.url, Entries=dels)
        self.assertEqual(len(deleted["Successful"]), 9)
        self.assertEqual([(f["Id"], f["Code"]) for f in deleted["Failed"]], [("junk", "ReceiptHandleIsInvalid")])
        with self.assertRaises(self.sqs.exceptions.TooManyEntriesInBatchRequest):
            self.sqs.send_message_batch(QueueUrl=self.url, Entries=[{"Id": f"x{i}", "MessageBody": "x"} for i in range(11)])
        with self.assertRaises(self.sqs.exceptions.BatchEntryIdsNotDistinct):
            self.sqs.send_message_batch(QueueUrl=self.url, Entries=[{"Id": "same", "MessageBody": "x"}] * 2)
        with self.assertRaises(self.sqs.exceptions.EmptyBatchRequest):
            self.sqs.delete_message_batch(QueueUrl=self.url, Entries=[])
        with self.assertRaises(self.sqs.exceptions.InvalidBatchEntryId):
            self.sqs.send_message_batch(QueueUrl=self.url, Entries=[{"Id": "has space", "MessageBody": "x"}])
        big = "x" * (200 * 1024)
        with self.assertRaises(self.sqs.exceptions.BatchRequestTooLong):
            self.sqs.send_message_batch(QueueUrl=self.url, Entries=[{"Id": f"b{i}", "MessageBody": big} for i in range(6)])

    def test_long_poll_answers_when_a_message_arrives(self):
        start = time.monotonic()
        empty = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=1)
        self.assertNotIn("Messages", empty)
        self.assertGreaterEqual(time.monotonic() - start, 0.9)

        def later():
            time.sleep(1.0)
            client().send_message(QueueUrl=self.url, MessageBody="late")

        t = threading.Thread(target=later)
        start = time.monotonic()
        t.start()
        got = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=20)
        waited = time.monotonic() - start
        t.join()
        self.assertEqual(got["Messages"][0]["Body"], "late")
        self.assertLess(waited, 15)
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=got["Messages"][0]["ReceiptHandle"])

    def test_visibility_timeout_hides_then_returns_the_message(self):
        self.sqs.send_message(QueueUrl=self.url, MessageBody="vis")
        first = self.sqs.receive_message(QueueUrl=self.url, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))
        again = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=10, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        self.assertEqual(again["MessageId"], first["MessageId"])
        self.assertEqual(again["Attributes"]["ApproximateReceiveCount"], "2")
        self.assertNotEqual(again["ReceiptHandle"], first["ReceiptHandle"])
        # The first receive's handle is stale: its delete succeeds and deletes nothing.
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=first["ReceiptHandle"])
        with self.assertRaises(self.sqs.exceptions.MessageNotInflight):
            self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5)
        # The current handle still holds the message: visibility 0 returns it at once.
        self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=0)
        third = self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(third["MessageId"], first["MessageId"])
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=third["ReceiptHandle"])
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=1))

    def test_change_visibility_extends_and_batch_answers_each(self):
        self.sqs.send_message_batch(QueueUrl=self.url, Entries=[{"Id": "a", "MessageBody": "a"}, {"Id": "b", "MessageBody": "b"}])
        got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=2, VisibilityTimeout=1)["Messages"]
        self.assertEqual(len(got), 2)
        res = self.sqs.change_message_visibility_batch(
            QueueUrl=self.url,
            Entries=[{"Id": f"c{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 60} for i, m in enumerate(got)]
            + [{"Id": "junk", "ReceiptHandle": "AAAA", "VisibilityTimeout": 5}],
        )
        self.assertEqual(len(res["Successful"]), 2)
        self.assertEqual(res["Failed"][0]["Code"], "ReceiptHandleIsInvalid")
        time.sleep(2.5)
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.url))
        for m in got:
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def test_a_handle_of_another_queue_is_invalid(self):
        self.sqs.send_message(QueueUrl=self.url, MessageBody="mine")
        m = self.sqs.receive_message(QueueUrl=self.url)["Messages"][0]
        with self.assertRaises(self.sqs.exceptions.ReceiptHandleIsInvalid):
            self.sqs.delete_message(QueueUrl=self.other, ReceiptHandle=m["ReceiptHandle"])
        self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def test_purge_queue(self):
        self.sqs.send_message_batch(QueueUrl=self.other, Entries=[{"Id": f"p{i}", "MessageBody": "p"} for i in range(5)])
        self.sqs.purge_queue(QueueUrl=self.other)
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=self.other, WaitTimeSeconds=1))
        with self.assertRaises(self.sqs.exceptions.PurgeQueueInProgress):
            self.sqs.purge_queue(QueueUrl=self.other)

    # -- bad input ---------------------------------------------------------------

    def test_out_of_range_parameters_are_invalid_parameter_value(self):
        cases = [
            lambda: self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=11),
            lambda: self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=0),
            lambda: self.sqs.receive_message(QueueUrl=self.url, WaitTimeSeconds=21),
            lambda: self.sqs.receive_message(QueueUrl=self.url, VisibilityTimeout=43201),
            lambda: self.sqs.send_message(QueueUrl=self.url, MessageBody="x", DelaySeconds=901),
            lambda: self.sqs.send_message(QueueUrl=self.url, MessageBody="x" * ((1 << 20) + 1)),
            lambda: self.sqs.send_message(
                QueueUrl=self.url,
                MessageBody="x",
                MessageAttributes={f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
            ),
            lambda: self.sqs.send_message(
                QueueUrl=self.url, MessageBody="x", MessageAttributes={"n": {"DataType": "Number", "StringValue": "abc"}}
            ),
        ]
        for case in cases:
            with self.assertRaises(self.sqs.exceptions.ClientError) as ctx:
                case()
            self.assertEqual(self.error_code(ctx), "InvalidParameterValue")
            self.assertEqual(ctx.exception.response["ResponseMetadata"]["HTTPStatusCode"], 400)

    def test_body_characters_outside_the_sqs_set_are_invalid_message_contents(self):
        with self.assertRaises(self.sqs.exceptions.InvalidMessageContents):
            self.sqs.send_message(QueueUrl=self.url, MessageBody="bad \x01 char")

    def test_malformed_receipt_handle(self):
        with self.assertRaises(self.sqs.exceptions.ReceiptHandleIsInvalid) as ctx:
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle="garbage")
        self.assertEqual(self.error_code(ctx), "ReceiptHandleIsInvalid")

    def test_receive_from_a_queue_qd_runs_itself_is_unsupported(self):
        url = self.sqs.get_queue_url(QueueName="cmd")["QueueUrl"]
        with self.assertRaises(self.sqs.exceptions.UnsupportedOperation):
            self.sqs.receive_message(QueueUrl=url)


class CreatedQueues(unittest.TestCase):
    """Queues made with CreateQueue: stored, attributes in force, deleted, tagged,
    dead-lettered by their redrive policy and moved back by a move task."""

    @classmethod
    def setUpClass(cls):
        cls.sqs = client()

    def name(self, suffix):
        return f"{PROTOCOL}-{self._testMethodName[5:30]}-{suffix}"

    def arn(self, name):
        return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"

    def attrs(self, url):
        return self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

    def assert_absent(self, name):
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.get_queue_url(QueueName=name)

    def test_create_queue_makes_a_queue_with_its_attributes(self):
        name = self.name("q")
        url = self.sqs.create_queue(
            QueueName=name,
            Attributes={"VisibilityTimeout": "45", "DelaySeconds": "0", "MaximumMessageSize": "2048"},
            tags={"team": "core"},
        )["QueueUrl"]
        self.assertEqual(url, f"{ENDPOINT}/{ACCOUNT}/{name}")
        self.assertEqual(self.sqs.get_queue_url(QueueName=name)["QueueUrl"], url)
        self.assertIn(url, self.sqs.list_queues(QueueNamePrefix=name)["QueueUrls"])
        attrs = self.attrs(url)
        self.assertEqual(attrs["VisibilityTimeout"], "45")
        self.assertEqual(attrs["MaximumMessageSize"], "2048")
        self.assertEqual(attrs["MessageRetentionPeriod"], "345600")
        self.assertEqual(attrs["ReceiveMessageWaitTimeSeconds"], "0")
        self.assertEqual(attrs["QueueArn"], self.arn(name))
        self.assertEqual(attrs["ApproximateNumberOfMessages"], "0")
        self.assertEqual(self.sqs.list_queue_tags(QueueUrl=url)["Tags"], {"team": "core"})
        # Idempotent with the same attributes, or none; different ones are refused.
        self.assertEqual(self.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"], url)
        self.assertEqual(self.sqs.create_queue(QueueName=name)["QueueUrl"], url)
        with self.assertRaises(self.sqs.exceptions.QueueNameExists) as ctx:
            self.sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
        self.assertEqual(ctx.exception.response["Error"]["Code"], "QueueAlreadyExists")
        self.assertEqual(self.attrs(url)["VisibilityTimeout"], "45")
        # A working queue: a message goes through, and the size limit is the queue's.
        sent = self.sqs.send_message(QueueUrl=url, MessageBody="hello")
        got = self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(got["MessageId"], sent["MessageId"])
        self.sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
        with self.assertRaises(Exception) as ctx:
            self.sqs.send_message(QueueUrl=url, MessageBody="x" * 3000)
        self.assertEqual(ctx.exception.response["Error"]["Code"], "InvalidParameterValue")

    def test_bad_names_and_attributes_are_refused_and_create_nothing(self):
        for bad in ["has space", "x" * 81, "dots.here", ""]:
            with self.assertRaises(Exception) as ctx:
                self.sqs.create_queue(QueueName=bad)
            code = ctx.exception.response["Error"]["Code"] if hasattr(ctx.exception, "response") else "param"
            self.assertIn(code, ("InvalidParameterValue", "param"), bad)
        with self.assertRaises(self.sqs.exceptions.UnsupportedOperation):
            self.sqs.create_queue(QueueName=self.name("f") + ".fifo", Attributes={"FifoQueue": "true"})
        name = self.name("q")
        cases = [
            ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
            ({"DelaySeconds": "-1"}, "InvalidAttributeValue"),
            ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
            ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue"),
            ({"MaximumMessageSize": "abc"}, "InvalidAttributeValue"),
            ({"RedrivePolicy": "{not json"}, "InvalidAttributeValue"),
            ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": self.arn("nope"), "maxReceiveCount": 3})}, "InvalidAttributeValue"),
            ({"Colour": "red"}, "InvalidAttributeName"),
            ({"QueueArn": "x"}, "InvalidAttributeName"),
            ({"FifoQueue": "true"}, "AWS.SimpleQueueService.UnsupportedOperation"),
        ]
        for attributes, code in cases:
            with self.assertRaises(Exception) as ctx:
                self.sqs.create_queue(QueueName=name, Attributes=attributes)
            self.assertEqual(ctx.exception.response["Error"]["Code"], code, attributes)
            self.assert_absent(name)

    def test_set_queue_attributes_takes_effect(self):
        name = self.name("q")
        url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "0"})
        self.assertEqual(self.attrs(url)["VisibilityTimeout"], "0")
        sent = self.sqs.send_message(QueueUrl=url, MessageBody="again")["MessageId"]
        first = self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        second = self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(first["MessageId"], sent)
        self.assertEqual(second["MessageId"], sent, "visibility 0: visible again at once")
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "600"})
        got = self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1))
        self.sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
        # A queue delay applies to messages sent without their own.
        self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "600"})
        self.sqs.send_message(QueueUrl=url, MessageBody="later")
        self.assertEqual(self.attrs(url)["ApproximateNumberOfMessagesDelayed"], "1")
        # Bad values change nothing.
        for attributes, code in [
            ({"VisibilityTimeout": "-5"}, "InvalidAttributeValue"),
            ({"Nope": "1"}, "InvalidAttributeName"),
        ]:
            with self.assertRaises(Exception) as ctx:
                self.sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
            self.assertEqual(ctx.exception.response["Error"]["Code"], code)
        self.assertEqual(self.attrs(url)["VisibilityTimeout"], "600")
        # A queue of the config file is not changed over SQS.
        jobs = self.sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
        with self.assertRaises(self.sqs.exceptions.UnsupportedOperation):
            self.sqs.set_queue_attributes(QueueUrl=jobs, Attributes={"VisibilityTimeout": "5"})

    def test_delete_queue_removes_a_created_queue_and_refuses_a_configured_one(self):
        name = self.name("q")
        url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        self.sqs.send_message(QueueUrl=url, MessageBody="doomed")
        self.sqs.delete_queue(QueueUrl=url)
        self.assert_absent(name)
        with self.assertRaises(self.sqs.exceptions.QueueDoesNotExist):
            self.sqs.send_message(QueueUrl=url, MessageBody="x")
        jobs = self.sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
        with self.assertRaises(self.sqs.exceptions.UnsupportedOperation):
            self.sqs.delete_queue(QueueUrl=jobs)
        self.assertEqual(self.sqs.get_queue_url(QueueName="jobs")["QueueUrl"], jobs)
        # The name can be created again, empty.
        again = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=again))

    def test_tags(self):
        url = self.sqs.create_queue(QueueName=self.name("q"))["QueueUrl"]
        self.assertNotIn("Tags", self.sqs.list_queue_tags(QueueUrl=url))
        self.sqs.tag_queue(QueueUrl=url, Tags={"a": "1", "b": "2"})
        self.sqs.tag_queue(QueueUrl=url, Tags={"b": "3"})
        self.assertEqual(self.sqs.list_queue_tags(QueueUrl=url)["Tags"], {"a": "1", "b": "3"})
        self.sqs.untag_queue(QueueUrl=url, TagKeys=["a", "absent"])
        self.assertEqual(self.sqs.list_queue_tags(QueueUrl=url)["Tags"], {"b": "3"})
        with self.assertRaises(Exception) as ctx:
            self.sqs.tag_queue(QueueUrl=url, Tags={"k": "v" * 257})
        self.assertEqual(ctx.exception.response["Error"]["Code"], "InvalidParameterValue")

    def test_a_redrive_allow_policy_decides_who_may_dead_letter_into_a_queue(self):
        src_name = self.name("src")

        def policy(dlq_name):
            return json.dumps({"deadLetterTargetArn": self.arn(dlq_name), "maxReceiveCount": 3})

        def allow(permission, **more):
            return {"RedriveAllowPolicy": json.dumps({"redrivePermission": permission, **more})}

        denied, listed, everyone = self.name("deny"), self.name("byq"), self.name("all")
        self.sqs.create_queue(QueueName=denied, Attributes=allow("denyAll"))
        self.sqs.create_queue(QueueName=listed, Attributes=allow("byQueue", sourceQueueArns=[self.arn(src_name)]))
        self.sqs.create_queue(QueueName=everyone, Attributes=allow("allowAll"))

        def refused(call, why):
            with self.assertRaises(Exception) as ctx:
                call()
            error = ctx.exception.response["Error"]
            self.assertEqual(error["Code"], "InvalidParameterValue", error)
            self.assertIn(why, error["Message"])

        # denyAll refuses every source: the queue is not created.
        refused(lambda: self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy(denied)}), "denyAll")
        self.assert_absent(src_name)
        # byQueue lets the queues it lists, allowAll every queue.
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy(listed)})["QueueUrl"]
        self.sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": policy(everyone)})
        # A refused SetQueueAttributes changes nothing.
        refused(lambda: self.sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": policy(denied)}), "denyAll")
        self.assertEqual(json.loads(self.attrs(src)["RedrivePolicy"])["deadLetterTargetArn"], self.arn(everyone))
        other = self.sqs.create_queue(QueueName=self.name("other"))["QueueUrl"]
        refused(
            lambda: self.sqs.set_queue_attributes(QueueUrl=other, Attributes={"RedrivePolicy": policy(listed)}),
            "sourceQueueArns",
        )
        self.assertNotIn("RedrivePolicy", self.attrs(other))

    def test_redrive_policy_dead_letters_and_a_move_task_brings_back(self):
        dlq = self.sqs.create_queue(QueueName=self.name("dlq"))["QueueUrl"]
        policy = json.dumps({"deadLetterTargetArn": self.arn(self.name("dlq")), "maxReceiveCount": "2"})
        src_name = self.name("src")
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
        self.assertEqual(
            json.loads(self.attrs(src)["RedrivePolicy"]),
            {"deadLetterTargetArn": self.arn(self.name("dlq")), "maxReceiveCount": 2},
        )
        self.assertEqual(self.sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"], [src])
        sent = self.sqs.send_message(QueueUrl=src, MessageBody="poison")["MessageId"]
        for n in (1, 2):
            got = self.sqs.receive_message(
                QueueUrl=src, WaitTimeSeconds=10, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"]
            )["Messages"][0]
            self.assertEqual(got["MessageId"], sent)
            self.assertEqual(got["Attributes"]["ApproximateReceiveCount"], str(n))
        # Its second visibility timeout ends its budget: dead, not received again.
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.attrs(src)["ApproximateNumberOfMessagesNotVisible"] == "0":
                break
            time.sleep(0.2)
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=src, WaitTimeSeconds=2))
        with self.assertRaises(self.sqs.exceptions.UnsupportedOperation):
            self.sqs.start_message_move_task(SourceArn=self.arn(self.name("dlq")), DestinationArn=self.arn("jobs"))
        handle = self.sqs.start_message_move_task(SourceArn=self.arn(self.name("dlq")))["TaskHandle"]
        self.assertTrue(handle)
        deadline = time.time() + 30
        while True:
            task = self.sqs.list_message_move_tasks(SourceArn=self.arn(self.name("dlq")))["Results"][0]
            if task["Status"] != "RUNNING" or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(task["Status"], "COMPLETED")
        self.assertEqual(task["ApproximateNumberOfMessagesMoved"], 1)
        self.assertEqual(task["ApproximateNumberOfMessagesToMove"], 1)
        back = self.sqs.receive_message(QueueUrl=src, WaitTimeSeconds=10)["Messages"][0]
        self.assertEqual(back["MessageId"], sent)
        self.assertEqual(back["Body"], "poison")
        self.sqs.delete_message(QueueUrl=src, ReceiptHandle=back["ReceiptHandle"])
        # A queue no policy names is not a dead-letter queue; unknown ARNs and handles.
        with self.assertRaises(Exception) as ctx:
            self.sqs.start_message_move_task(SourceArn=self.arn(src_name))
        self.assertEqual(ctx.exception.response["Error"]["Code"], "InvalidParameterValue")
        with self.assertRaises(Exception) as ctx:
            self.sqs.start_message_move_task(SourceArn=self.arn("nope"))
        self.assertEqual(ctx.exception.response["Error"]["Code"], "ResourceNotFoundException")
        with self.assertRaises(Exception) as ctx:
            self.sqs.cancel_message_move_task(TaskHandle="nope")
        self.assertEqual(ctx.exception.response["Error"]["Code"], "ResourceNotFoundException")

    def job_state(self, message_id):
        """The job's state through qd's own HTTP API, or None once it is gone."""
        try:
            with urllib.request.urlopen(f"{ENDPOINT}/v1/jobs/{message_id}") as r:
                return json.loads(r.read())["state"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def kill_into_dlq(self, src, dlq, bodies):
        """Sends `bodies` to `src` (maxReceiveCount 1) and lets each die by one
        receive whose visibility passes; waits until the DLQ counts them."""
        sent = [self.sqs.send_message(QueueUrl=src, MessageBody=b)["MessageId"] for b in bodies]
        seen = set()
        deadline = time.time() + 30
        while len(seen) < len(sent) and time.time() < deadline:
            got = self.sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, WaitTimeSeconds=2, VisibilityTimeout=1)
            seen.update(m["MessageId"] for m in got.get("Messages", []))
        self.assertEqual(seen, set(sent))
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.attrs(dlq)["ApproximateNumberOfMessages"] == str(len(sent)):
                break
            time.sleep(0.2)
        self.assertEqual(self.attrs(dlq)["ApproximateNumberOfMessages"], str(len(sent)))
        return sent

    def test_a_dead_letter_queue_receives_deletes_counts_and_moves_back_dead_messages(self):
        dlq_name, src_name = self.name("dlq"), self.name("src")
        dlq = self.sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
        policy = json.dumps({"deadLetterTargetArn": self.arn(dlq_name), "maxReceiveCount": "1"})
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
        started_ms = int(time.time() * 1000) - 5000
        sent = self.kill_into_dlq(src, dlq, ["poison-0", "poison-1", "poison-2"])
        for mid in sent:
            self.assertEqual(self.job_state(mid), "dead", "dead in qd's DLQ until deleted")
        src_attrs = self.attrs(src)
        self.assertEqual(src_attrs["ApproximateNumberOfMessages"], "0")
        self.assertEqual(src_attrs["ApproximateNumberOfMessagesNotVisible"], "0")

        # One received through the DLQ: in flight there, with its history's counts.
        got = self.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=1, AttributeNames=["All"])["Messages"]
        self.assertEqual(len(got), 1)
        first = got[0]
        self.assertIn(first["MessageId"], sent)
        self.assertEqual(first["Body"], "poison-" + str(sent.index(first["MessageId"])))
        self.assertEqual(first["MD5OfBody"], hashlib.md5(first["Body"].encode()).hexdigest())
        attrs = first["Attributes"]
        self.assertEqual(attrs["ApproximateReceiveCount"], "2", "one receive in the source, one in the DLQ")
        self.assertEqual(attrs["DeadLetterQueueSourceArn"], self.arn(src_name))
        self.assertGreaterEqual(int(attrs["SentTimestamp"]), started_ms)
        self.assertLessEqual(int(attrs["SentTimestamp"]), int(attrs["ApproximateFirstReceiveTimestamp"]))
        counts = self.attrs(dlq)
        self.assertEqual(counts["ApproximateNumberOfMessages"], "2")
        self.assertEqual(counts["ApproximateNumberOfMessagesNotVisible"], "1")

        # The in-flight one is not handed out again; the others are.
        rest = self.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
        self.assertEqual(sorted(m["MessageId"] for m in rest), sorted(set(sent) - {first["MessageId"]}))
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10))
        # Visibility 0 gives them back at once (batch), and a bad handle fails its entry only.
        answer = self.sqs.change_message_visibility_batch(
            QueueUrl=dlq,
            Entries=[{"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for i, m in enumerate(rest)]
            + [{"Id": "bad", "ReceiptHandle": "garbage", "VisibilityTimeout": 0}],
        )
        self.assertEqual(len(answer["Successful"]), len(rest))
        self.assertEqual([f["Id"] for f in answer["Failed"]], ["bad"])
        counts = self.attrs(dlq)
        self.assertEqual(counts["ApproximateNumberOfMessages"], "2")
        self.assertEqual(counts["ApproximateNumberOfMessagesNotVisible"], "1")
        # Their old handles are over.
        with self.assertRaises(self.sqs.exceptions.MessageNotInflight):
            self.sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=rest[0]["ReceiptHandle"], VisibilityTimeout=5)
        self.sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=60)

        # A delete through the DLQ takes the message out of qd's DLQ, history and all.
        self.sqs.delete_message(QueueUrl=dlq, ReceiptHandle=first["ReceiptHandle"])
        self.assertIsNone(self.job_state(first["MessageId"]))
        self.sqs.delete_message(QueueUrl=dlq, ReceiptHandle=first["ReceiptHandle"])
        counts = self.attrs(dlq)
        self.assertEqual(counts["ApproximateNumberOfMessages"], "2")
        self.assertEqual(counts["ApproximateNumberOfMessagesNotVisible"], "0")
        # Received again, the others' first handles are stale: a delete with one
        # succeeds and deletes nothing.
        fresh = self.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
        self.assertEqual(sorted(m["MessageId"] for m in fresh), sorted(m["MessageId"] for m in rest))
        self.sqs.delete_message(QueueUrl=dlq, ReceiptHandle=rest[0]["ReceiptHandle"])
        self.assertEqual(self.job_state(rest[0]["MessageId"]), "dead")
        for m in fresh:
            self.sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
        # A DLQ handle is no handle of the source queue.
        with self.assertRaises(self.sqs.exceptions.ReceiptHandleIsInvalid):
            self.sqs.delete_message(QueueUrl=src, ReceiptHandle=rest[0]["ReceiptHandle"])

        # Receive one again (its count grows) and hold it: the move task moves the
        # unreceived one back only.
        again = self.sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=1, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        self.assertEqual(again["Attributes"]["ApproximateReceiveCount"], "4", "1 in the source, 3 in the DLQ")
        handle = self.sqs.start_message_move_task(SourceArn=self.arn(dlq_name))["TaskHandle"]
        self.assertTrue(handle)
        deadline = time.time() + 30
        while True:
            task = self.sqs.list_message_move_tasks(SourceArn=self.arn(dlq_name))["Results"][0]
            if task["Status"] != "RUNNING" or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(task["Status"], "COMPLETED")
        self.assertEqual(task["ApproximateNumberOfMessagesMoved"], 1)
        moved = (set(sent) - {first["MessageId"], again["MessageId"]}).pop()
        back = self.sqs.receive_message(QueueUrl=src, WaitTimeSeconds=10)["Messages"][0]
        self.assertEqual(back["MessageId"], moved)
        self.sqs.delete_message(QueueUrl=src, ReceiptHandle=back["ReceiptHandle"])
        self.assertEqual(self.job_state(moved), "succeeded")
        # The held one is deleted in a batch with a message of the DLQ's own.
        own = self.sqs.send_message(QueueUrl=dlq, MessageBody="own")["MessageId"]
        own_msg = self.sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(own_msg["MessageId"], own)
        answer = self.sqs.delete_message_batch(
            QueueUrl=dlq,
            Entries=[{"Id": "dead", "ReceiptHandle": again["ReceiptHandle"]}, {"Id": "own", "ReceiptHandle": own_msg["ReceiptHandle"]}],
        )
        self.assertEqual(sorted(s["Id"] for s in answer["Successful"]), ["dead", "own"])
        self.assertIsNone(self.job_state(again["MessageId"]))
        self.assertEqual(self.job_state(own), "succeeded")
        counts = self.attrs(dlq)
        self.assertEqual(counts["ApproximateNumberOfMessages"], "0")
        self.assertEqual(counts["ApproximateNumberOfMessagesNotVisible"], "0")

    def test_purging_a_dead_letter_queue_purges_its_dead_messages(self):
        dlq_name, src_name = self.name("dlq"), self.name("src")
        dlq = self.sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
        policy = json.dumps({"deadLetterTargetArn": self.arn(dlq_name), "maxReceiveCount": "1"})
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
        sent = self.kill_into_dlq(src, dlq, ["a", "b"])
        held = self.sqs.receive_message(QueueUrl=dlq)["Messages"][0]
        self.sqs.purge_queue(QueueUrl=dlq)
        for mid in sent:
            self.assertIsNone(self.job_state(mid))
        counts = self.attrs(dlq)
        self.assertEqual(counts["ApproximateNumberOfMessages"], "0")
        self.assertEqual(counts["ApproximateNumberOfMessagesNotVisible"], "0")
        self.assertNotIn("Messages", self.sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=1))
        self.sqs.delete_message(QueueUrl=dlq, ReceiptHandle=held["ReceiptHandle"])

    def test_a_dead_letter_queue_long_poll_returns_a_message_that_dies_meanwhile(self):
        dlq_name, src_name = self.name("dlq"), self.name("src")
        dlq = self.sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
        policy = json.dumps({"deadLetterTargetArn": self.arn(dlq_name), "maxReceiveCount": "1"})
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
        sent = self.sqs.send_message(QueueUrl=src, MessageBody="late")["MessageId"]
        self.assertEqual(self.sqs.receive_message(QueueUrl=src, WaitTimeSeconds=5, VisibilityTimeout=2)["Messages"][0]["MessageId"], sent)
        started = time.time()
        got = self.sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=20)["Messages"]
        self.assertEqual(got[0]["MessageId"], sent)
        self.assertLess(time.time() - started, 19, "answered when it died, not at the end of the poll")

    def wait_task(self, dlq_arn):
        deadline = time.time() + 60
        while True:
            task = self.sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]
            if task["Status"] not in ("RUNNING", "CANCELLING") or time.time() > deadline:
                return task
            time.sleep(0.1)

    def test_a_paced_move_task_moves_so_many_a_second_and_stops_when_cancelled(self):
        dlq_name, src_name = self.name("dlq"), self.name("src")
        dlq = self.sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
        policy = json.dumps({"deadLetterTargetArn": self.arn(dlq_name), "maxReceiveCount": "1"})
        src = self.sqs.create_queue(QueueName=src_name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
        self.kill_into_dlq(src, dlq, [f"m{i}" for i in range(5)])
        # One a second: a cancel right after the start stops it before the fifth.
        handle = self.sqs.start_message_move_task(SourceArn=self.arn(dlq_name), MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
        self.sqs.cancel_message_move_task(TaskHandle=handle)
        task = self.wait_task(self.arn(dlq_name))
        self.assertEqual(task["Status"], "CANCELLED")
        self.assertEqual(task["MaxNumberOfMessagesPerSecond"], 1)
        moved = task["ApproximateNumberOfMessagesMoved"]
        self.assertLess(moved, 5)
        left = 5 - moved
        self.assertEqual(self.attrs(dlq)["ApproximateNumberOfMessages"], str(left))
        # Two a second: the rest take at least ceil(left / 2) - 1 seconds.
        started = time.time()
        self.sqs.start_message_move_task(SourceArn=self.arn(dlq_name), MaxNumberOfMessagesPerSecond=2)
        task = self.wait_task(self.arn(dlq_name))
        took = time.time() - started
        self.assertEqual(task["Status"], "COMPLETED")
        self.assertEqual(task["ApproximateNumberOfMessagesMoved"], left)
        self.assertGreaterEqual(took, (left + 1) // 2 - 1 - 0.05, task)
        self.assertEqual(self.attrs(dlq)["ApproximateNumberOfMessages"], "0")
        self.assertEqual(self.attrs(src)["ApproximateNumberOfMessages"], "5")
        with self.assertRaises(Exception) as ctx:
            self.sqs.start_message_move_task(SourceArn=self.arn(dlq_name), MaxNumberOfMessagesPerSecond=501)
        code = ctx.exception.response["Error"]["Code"] if hasattr(ctx.exception, "response") else "param"
        self.assertIn(code, ("InvalidParameterValue", "param"))


class RawWire(unittest.TestCase):
    """The error answers' exact shape, which SDKs depend on."""

    def post(self, body, headers):
        req = urllib.request.Request(ENDPOINT + "/", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def test_json_error_has_type_query_error_and_request_id(self):
        status, headers, body = self.post(
            json.dumps({"QueueName": "nope"}).encode(),
            {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.GetQueueUrl"},
        )
        self.assertEqual(status, 400)
        doc = json.loads(body)
        self.assertEqual(doc["__type"], "com.amazonaws.sqs#QueueDoesNotExist")
        lower = {k.lower(): v for k, v in headers.items()}
        self.assertEqual(lower["x-amzn-query-error"], "AWS.SimpleQueueService.NonExistentQueue;Sender")
        self.assertTrue(lower["x-amzn-requestid"])

    def test_query_error_is_an_error_response_document(self):
        status, headers, body = self.post(
            b"Action=GetQueueUrl&Version=2012-11-05&QueueName=nope",
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        self.assertEqual(status, 400)
        text = body.decode()
        self.assertIn("<ErrorResponse>", text)
        self.assertIn("<Code>AWS.SimpleQueueService.NonExistentQueue</Code>", text)
        self.assertIn("<Type>Sender</Type>", text)

    def test_garbage_never_gets_a_5xx(self):
        cases = [
            (b"{not json", {"X-Amz-Target": "AmazonSQS.SendMessage"}),
            (b"[1,2]", {"X-Amz-Target": "AmazonSQS.SendMessage"}),
            (b"{}", {"X-Amz-Target": "Other.Thing"}),
            (b"{}", {"X-Amz-Target": "AmazonSQS.NoSuchAction"}),
            (b'{"QueueUrl": 5}', {"X-Amz-Target": "AmazonSQS.SendMessage"}),
            (b'{"QueueUrl": "/000000000000/jobs", "Entries": "x"}', {"X-Amz-Target": "AmazonSQS.SendMessageBatch"}),
            (b'{"QueueUrl": "/000000000000/jobs", "MessageBody": "x", "MessageAttributes": []}', {"X-Amz-Target": "AmazonSQS.SendMessage"}),
            (b"Action=SendMessage&QueueUrl=%FF%FE", {}),
            (b"Action=ReceiveMessage&QueueUrl=/000000000000/jobs&MaxNumberOfMessages=ten", {}),
            (b"\xff\xfe\x00", {}),
            (b"", {}),
        ]
        for body, headers in cases:
            status, _, text = self.post(body, headers)
            self.assertGreaterEqual(status, 400, (body, text))
            self.assertLess(status, 500, (body, text))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
