"""SigV4 on qd's SQS API with a token file (run by daemon/tests/sqs.rs).

QD_SQS_ENDPOINT is qd; the token file gives access key QD_KEY / QD_SECRET every
role on every queue, and QD_LIMITED_KEY / QD_LIMITED_SECRET only `produce` on
`other`.
"""

import datetime
import hashlib
import hmac
import os
import sys
import unittest
import urllib.error
import urllib.parse
import urllib.request

import botocore.session
from botocore.config import Config

ENDPOINT = os.environ["QD_SQS_ENDPOINT"]


def client(key, secret):
    return botocore.session.get_session().create_client(
        "sqs",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )


def signed_post(key, secret, body, when):
    """A query-protocol POST signed by hand (AWS's documented SigV4 steps) at `when`."""
    host = urllib.parse.urlparse(ENDPOINT).netloc
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload_hash = hashlib.sha256(body).hexdigest()
    headers = {"content-type": "application/x-www-form-urlencoded", "host": host, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        ["POST", "/", "", "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, payload_hash]
    )
    scope = f"{day}/us-east-1/sqs/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in [day, "us-east-1", "sqs", "aws4_request"]:
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={signed}, Signature={sig}"
    del headers["host"]
    req = urllib.request.Request(ENDPOINT + "/", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class SigV4(unittest.TestCase):
    key, secret = os.environ["QD_KEY"], os.environ["QD_SECRET"]

    def test_a_good_signature_is_accepted(self):
        sqs = client(self.key, self.secret)
        url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="signed")
        m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(m["Body"], "signed")
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def test_a_hand_signed_request_is_accepted(self):
        now = datetime.datetime.now(datetime.timezone.utc)
        status, text = signed_post(self.key, self.secret, b"Action=ListQueues&Version=2012-11-05", now)
        self.assertEqual(status, 200, text)
        self.assertIn("<QueueUrl>", text)

    def test_a_wrong_secret_is_signature_does_not_match(self):
        sqs = client(self.key, "wrong-secret-wrong-secret")
        with self.assertRaises(sqs.exceptions.ClientError) as ctx:
            sqs.list_queues()
        self.assertEqual(ctx.exception.response["Error"]["Code"], "SignatureDoesNotMatch")
        self.assertEqual(ctx.exception.response["ResponseMetadata"]["HTTPStatusCode"], 403)

    def test_an_unknown_access_key_is_invalid_client_token_id(self):
        sqs = client("AKIDUNKNOWNUNKNOWN", self.secret)
        with self.assertRaises(sqs.exceptions.ClientError) as ctx:
            sqs.list_queues()
        self.assertEqual(ctx.exception.response["Error"]["Code"], "InvalidClientTokenId")
        self.assertEqual(ctx.exception.response["ResponseMetadata"]["HTTPStatusCode"], 403)

    def test_an_expired_date_is_request_expired(self):
        old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        status, text = signed_post(self.key, self.secret, b"Action=ListQueues&Version=2012-11-05", old)
        self.assertEqual(status, 400, text)
        self.assertIn("<Code>RequestExpired</Code>", text)

    def test_an_unsigned_request_is_missing_authentication_token(self):
        req = urllib.request.Request(ENDPOINT + "/", data=b"Action=ListQueues", method="POST")
        with self.assertRaises(urllib.error.HTTPError) as ctx:
            urllib.request.urlopen(req)
        self.assertEqual(ctx.exception.code, 403)
        self.assertIn("MissingAuthenticationToken", ctx.exception.read().decode())

    def test_the_tokens_roles_and_queues_apply(self):
        sqs = client(os.environ["QD_LIMITED_KEY"], os.environ["QD_LIMITED_SECRET"])
        other = sqs.get_queue_url(QueueName="other")["QueueUrl"]
        sqs.send_message(QueueUrl=other, MessageBody="allowed")
        with self.assertRaises(sqs.exceptions.ClientError) as ctx:
            sqs.receive_message(QueueUrl=other)
        self.assertEqual(ctx.exception.response["Error"]["Code"], "AccessDenied")
        with self.assertRaises(sqs.exceptions.ClientError) as ctx:
            sqs.get_queue_url(QueueName="jobs")
        self.assertEqual(ctx.exception.response["Error"]["Code"], "AccessDenied")
        self.assertEqual(sqs.list_queues()["QueueUrls"], [other])


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
