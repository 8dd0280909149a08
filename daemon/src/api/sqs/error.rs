//! SQS's errors: each [`ErrorKind`] with the HTTP status, the JSON protocol's
//! `__type` (the botocore shape name) and the query protocol's legacy code that
//! Amazon SQS answers with, so every SDK raises its own exception type
//! (`QueueDoesNotExist`, `ReceiptHandleIsInvalid`, ...).
//!
//! The JSON protocol's answer is `{"__type": "com.amazonaws.sqs#<Shape>",
//! "message": ...}` with the header `x-amzn-query-error: <legacy code>;Sender`
//! (current botocore reads the code from that header); the query protocol's is
//! the `<ErrorResponse>` document (`wire.rs` renders both).

use axum::http::StatusCode;

use crate::broker::BrokerError;
use crate::store::StoreError;

/// Every error qd's SQS API answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ErrorKind {
    QueueDoesNotExist,
    QueueNameExists,
    ReceiptHandleIsInvalid,
    InvalidParameterValue,
    MissingParameter,
    InvalidAction,
    InvalidAttributeName,
    InvalidAttributeValue,
    InvalidMessageContents,
    BatchEntryIdsNotDistinct,
    EmptyBatchRequest,
    TooManyEntriesInBatchRequest,
    InvalidBatchEntryId,
    BatchRequestTooLong,
    PurgeQueueInProgress,
    MessageNotInflight,
    UnsupportedOperation,
    RequestThrottled,
    AccessDenied,
    InvalidClientTokenId,
    SignatureDoesNotMatch,
    MissingAuthenticationToken,
    IncompleteSignature,
    RequestExpired,
    ResourceNotFound,
    ServiceUnavailable,
}

impl ErrorKind {
    /// The HTTP status Amazon SQS answers with.
    pub fn status(self) -> StatusCode {
        use ErrorKind::*;
        match self {
            PurgeQueueInProgress
            | AccessDenied
            | InvalidClientTokenId
            | SignatureDoesNotMatch
            | MissingAuthenticationToken => StatusCode::FORBIDDEN,
            ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ResourceNotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// The error's shape name, the JSON protocol's `__type` after `#`.
    pub fn shape(self) -> &'static str {
        use ErrorKind::*;
        match self {
            QueueDoesNotExist => "QueueDoesNotExist",
            QueueNameExists => "QueueNameExists",
            ReceiptHandleIsInvalid => "ReceiptHandleIsInvalid",
            InvalidParameterValue => "InvalidParameterValue",
            MissingParameter => "MissingParameter",
            InvalidAction => "InvalidAction",
            InvalidAttributeName => "InvalidAttributeName",
            InvalidAttributeValue => "InvalidAttributeValue",
            InvalidMessageContents => "InvalidMessageContents",
            BatchEntryIdsNotDistinct => "BatchEntryIdsNotDistinct",
            EmptyBatchRequest => "EmptyBatchRequest",
            TooManyEntriesInBatchRequest => "TooManyEntriesInBatchRequest",
            InvalidBatchEntryId => "InvalidBatchEntryId",
            BatchRequestTooLong => "BatchRequestTooLong",
            PurgeQueueInProgress => "PurgeQueueInProgress",
            MessageNotInflight => "MessageNotInflight",
            UnsupportedOperation => "UnsupportedOperation",
            RequestThrottled => "RequestThrottled",
            AccessDenied => "AccessDenied",
            MissingAuthenticationToken => "MissingAuthenticationToken",
            InvalidClientTokenId => "InvalidClientTokenId",
            SignatureDoesNotMatch => "SignatureDoesNotMatch",
            IncompleteSignature => "IncompleteSignature",
            RequestExpired => "RequestExpired",
            ResourceNotFound => "ResourceNotFoundException",
            ServiceUnavailable => "ServiceUnavailable",
        }
    }

    /// The query protocol's code (`<Code>`, and `x-amzn-query-error`).
    pub fn code(self) -> &'static str {
        use ErrorKind::*;
        match self {
            QueueDoesNotExist => "AWS.SimpleQueueService.NonExistentQueue",
            QueueNameExists => "QueueAlreadyExists",
            BatchEntryIdsNotDistinct => "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            EmptyBatchRequest => "AWS.SimpleQueueService.EmptyBatchRequest",
            TooManyEntriesInBatchRequest => "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            InvalidBatchEntryId => "AWS.SimpleQueueService.InvalidBatchEntryId",
            BatchRequestTooLong => "AWS.SimpleQueueService.BatchRequestTooLong",
            PurgeQueueInProgress => "AWS.SimpleQueueService.PurgeQueueInProgress",
            MessageNotInflight => "AWS.SimpleQueueService.MessageNotInflight",
            UnsupportedOperation => "AWS.SimpleQueueService.UnsupportedOperation",
            other => other.shape(),
        }
    }

    /// `Sender` for the caller's fault, `Receiver` for qd's.
    pub fn fault(self) -> &'static str {
        if self.status().is_server_error() {
            "Receiver"
        } else {
            "Sender"
        }
    }
}

/// An SQS error answer: what kind, and what is wrong in words.
#[derive(Clone, Debug)]
pub struct SqsError {
    /// The kind (status, type, code).
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
}

impl SqsError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        SqsError {
            kind,
            message: message.into(),
        }
    }

    /// `InvalidParameterValue` saying `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidParameterValue, message)
    }

    /// `MissingParameter` for the parameter `name`.
    pub fn missing(name: &str) -> Self {
        Self::new(
            ErrorKind::MissingParameter,
            format!("The request must contain the parameter {name}."),
        )
    }

    /// `QueueDoesNotExist`.
    pub fn no_queue(name: &str) -> Self {
        Self::new(
            ErrorKind::QueueDoesNotExist,
            format!("The specified queue {name:?} does not exist."),
        )
    }
}

impl From<BrokerError> for SqsError {
    fn from(err: BrokerError) -> Self {
        let message = err.to_string();
        let kind = match err {
            BrokerError::UnknownQueue(_) => ErrorKind::QueueDoesNotExist,
            BrokerError::QueueFull { .. } | BrokerError::TenantFull { .. } => {
                ErrorKind::RequestThrottled
            }
            BrokerError::Invalid(_)
            | BrokerError::UnknownDependency(_)
            | BrokerError::KeyConflict { .. }
            | BrokerError::KeyConflictInBatch { .. }
            | BrokerError::PayloadTooLarge { .. }
            | BrokerError::UnknownJob(_)
            | BrokerError::Transition(_) => ErrorKind::InvalidParameterValue,
            BrokerError::ShuttingDown | BrokerError::Unavailable(_) | BrokerError::Store(_) => {
                ErrorKind::ServiceUnavailable
            }
        };
        SqsError { kind, message }
    }
}

impl From<StoreError> for SqsError {
    fn from(err: StoreError) -> Self {
        SqsError::new(ErrorKind::ServiceUnavailable, format!("store: {err}"))
    }
}

impl From<crate::api::ApiError> for SqsError {
    fn from(err: crate::api::ApiError) -> Self {
        let kind = match err.status {
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => ErrorKind::AccessDenied,
            s if s.is_server_error() => ErrorKind::ServiceUnavailable,
            _ => ErrorKind::InvalidParameterValue,
        };
        SqsError::new(kind, err.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modeled_errors_carry_the_legacy_codes_the_query_protocol_models() {
        assert_eq!(
            ErrorKind::QueueDoesNotExist.code(),
            "AWS.SimpleQueueService.NonExistentQueue"
        );
        assert_eq!(ErrorKind::QueueNameExists.code(), "QueueAlreadyExists");
        assert_eq!(
            ErrorKind::PurgeQueueInProgress.status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            ErrorKind::ReceiptHandleIsInvalid.code(),
            "ReceiptHandleIsInvalid"
        );
        assert_eq!(ErrorKind::ServiceUnavailable.fault(), "Receiver");
        assert_eq!(ErrorKind::InvalidParameterValue.fault(), "Sender");
    }
}
