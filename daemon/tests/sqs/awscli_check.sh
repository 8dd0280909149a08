#!/bin/sh
# The AWS CLI sends one message to qd, receives it and deletes it (run by
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
echo "OK: sent, received and deleted through the AWS CLI"
