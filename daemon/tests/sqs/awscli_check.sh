#!/bin/sh
# The AWS CLI sends one message to qd, receives it and deletes it, then creates a
# queue with an attribute, changes it and deletes the queue (run by
# daemon/tests/sqs.rs with the CLI of .ci/venv first on PATH and QD_SQS_ENDPOINT set).
set -eu
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
sqs() { aws --endpoint-url "$QD_SQS_ENDPOINT" sqs "$@"; }
url=$(sqs get-queue-url --queue-name jobs --output text --query QueueUrl)
sqs send-message --queue-url "$url" --message-body "from the aws cli" --output json
got=$(sqs receive-message --queue-url "$url" --wait-time-seconds 5 --output text \
    --query 'Messages[0].[Body,ReceiptHandle]')
body=$(printf '%s' "$got" | cut -f1)
handle=$(printf '%s' "$got" | cut -f2)
[ "$body" = "from the aws cli" ] || { echo "received body: $body"; exit 1; }
sqs delete-message --queue-url "$url" --receipt-handle "$handle"
left=$(sqs receive-message --queue-url "$url" --output text --query 'length(Messages || `[]`)')
[ "$left" = "0" ] || { echo "left after delete: $left"; exit 1; }
made=$(sqs create-queue --queue-name cli-made --attributes VisibilityTimeout=40 \
    --output text --query QueueUrl)
[ "$made" = "$QD_SQS_ENDPOINT/000000000000/cli-made" ] || { echo "created: $made"; exit 1; }
sqs set-queue-attributes --queue-url "$made" --attributes VisibilityTimeout=50
vt=$(sqs get-queue-attributes --queue-url "$made" --attribute-names VisibilityTimeout \
    --output text --query Attributes.VisibilityTimeout)
[ "$vt" = "50" ] || { echo "VisibilityTimeout after set: $vt"; exit 1; }
sqs delete-queue --queue-url "$made"
if sqs get-queue-url --queue-name cli-made >/dev/null 2>&1; then
    echo "cli-made still there after delete-queue"; exit 1
fi
echo "OK: sent, received and deleted through the AWS CLI; created, changed and deleted a queue"
