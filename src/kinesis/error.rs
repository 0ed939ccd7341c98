//! What a Kinesis call can end in, told apart so callers can act on it.

use aws_sdk_kinesis::config::http::HttpResponse;
use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// Why a Kinesis call failed. Messages never hold credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KinesisError {
    #[error(
        "no AWS region: set AWS_REGION (or --kinesis-region, or `region` in the AWS profile \
         AWS_PROFILE names)"
    )]
    MissingRegion,
    #[error(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, \
         or run with a container or instance role (see the README for the IAM policy)"
    )]
    MissingCredentials,
    /// Kinesis asked to slow down, and the SDK's retries did not get through.
    #[error("Kinesis is throttling {0}")]
    Throttled(String),
    /// No such stream (or shard).
    #[error("{0}")]
    NotFound(String),
    /// The account's shard limit would be exceeded.
    #[error("{0}")]
    LimitExceeded(String),
    /// The stream is not ACTIVE (being created, updated or deleted).
    #[error("{0}")]
    InUse(String),
    /// Kinesis failed on its side (an HTTP 5xx answer, such as InternalFailure): the call may
    /// or may not have been made.
    #[error("Kinesis failed: {0}")]
    Failed(String),
    /// No answer: connection refused, a timeout, a broken connection.
    #[error("Kinesis is unreachable: {0}")]
    Unreachable(String),
    #[error("{0}")]
    Other(String),
}

impl KinesisError {
    /// The error of `call` (an action name, for messages) as the SDK reported it.
    pub(super) fn from_sdk<E>(call: &str, err: SdkError<E, HttpResponse>) -> KinesisError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match &err {
            SdkError::TimeoutError(_) => KinesisError::Unreachable(format!("{call} timed out")),
            SdkError::DispatchFailure(failure) => KinesisError::Unreachable(format!(
                "{call}: {}",
                if failure.is_timeout() {
                    "timed out".to_owned()
                } else {
                    DisplayErrorContext(&err).to_string()
                }
            )),
            SdkError::ServiceError(service) => {
                let code = service.err().code().unwrap_or("an unnamed error");
                let message = service.err().message().unwrap_or("");
                if service.raw().status().is_server_error() {
                    KinesisError::Failed(format!("{call}: {code}: {message}"))
                } else {
                    Self::from_code(call, code, message)
                }
            }
            _ => KinesisError::Other(format!("{call}: {}", DisplayErrorContext(&err))),
        }
    }

    /// An error Kinesis answered, by its code. `LimitExceededException` says both "too many
    /// requests" and "too many shards": only the second names the shard limit.
    fn from_code(call: &str, code: &str, message: &str) -> KinesisError {
        let said = format!("{call}: {code}: {message}");
        match code {
            "ResourceNotFoundException" => KinesisError::NotFound(said),
            "ResourceInUseException" => KinesisError::InUse(said),
            "LimitExceededException" if message.to_ascii_lowercase().contains("shard limit") => {
                KinesisError::LimitExceeded(said)
            }
            "LimitExceededException"
            | "ThrottlingException"
            | "ProvisionedThroughputExceededException" => KinesisError::Throttled(said),
            _ => KinesisError::Other(said),
        }
    }

    /// A short name for logs and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            KinesisError::MissingRegion => "missing_region",
            KinesisError::MissingCredentials => "missing_credentials",
            KinesisError::Throttled(_) => "throttled",
            KinesisError::NotFound(_) => "not_found",
            KinesisError::LimitExceeded(_) => "limit_exceeded",
            KinesisError::InUse(_) => "in_use",
            KinesisError::Failed(_) => "failed",
            KinesisError::Unreachable(_) => "unreachable",
            KinesisError::Other(_) => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_exceeded_is_throttling_unless_it_names_the_shard_limit() {
        let shard_limit = "This request would exceed the shard limit for the account \
                           000000000000 in us-east-1. Current shard limit is 500.";
        let err = KinesisError::from_code("SplitShard", "LimitExceededException", shard_limit);
        assert!(matches!(err, KinesisError::LimitExceeded(_)), "{err:?}");
        let rate = "Rate exceeded for stream s under account 000000000000.";
        let err = KinesisError::from_code("ListShards", "LimitExceededException", rate);
        assert!(matches!(err, KinesisError::Throttled(_)), "{err:?}");
        let err = KinesisError::from_code("ListShards", "ResourceNotFoundException", "gone");
        assert_eq!(
            err,
            KinesisError::NotFound("ListShards: ResourceNotFoundException: gone".into())
        );
        let err = KinesisError::from_code("SplitShard", "ResourceInUseException", "UPDATING");
        assert_eq!(err.kind(), "in_use");
        let err = KinesisError::from_code("ListShards", "AccessDeniedException", "no");
        assert_eq!(err.kind(), "other");
    }
}
