//! Every error becomes a gRPC status here, and only here.

use tonic::Status;

use crate::access::Denied;
use crate::engine::{ErrorKind, RequestError};
use crate::rules::RuleErrors;

/// What the transport itself refuses, before or beside a decision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("{max} Watch streams are open; the limit is {max} (--max-watchers)")]
    TooManyWatchers { max: usize },
    #[error("{max} RLQS streams are open")]
    TooManyQuotaStreams { max: usize },
    #[error("the request is larger than this method's limit of {cap} bytes")]
    TooLarge { cap: usize },
    #[error("{of} holds {max} bytes of unfinished requests at most; send the request again")]
    Unfinished { max: usize, of: &'static str },
    #[error("no such method")]
    NoSuchMethod,
    /// The Admin gate's answer: no credential, or not enough of one.
    #[error("{0}")]
    Denied(Denied),
}

/// The code of an error kind the engine returns.
pub fn code(kind: ErrorKind) -> tonic::Code {
    {
        match kind {
            ErrorKind::BadInput => tonic::Code::InvalidArgument,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::TooMany => tonic::Code::ResourceExhausted,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
        }
    }
}

/// An error of the engine's or the rules', as its status. A local trait: the
/// orphan rule keeps `From` between two other crates' types out of this one.
pub(crate) trait IntoStatus {
    fn into_status(self) -> Status;
}

impl IntoStatus for RequestError {
    fn into_status(self) -> Status {
        Status::new(code(self.kind()), self.to_string())
    }
}

impl IntoStatus for RuleErrors {
    fn into_status(self) -> Status {
        Status::invalid_argument(self.to_string())
    }
}

impl IntoStatus for crate::decider::RevertError {
    fn into_status(self) -> Status {
        match self {
            crate::decider::RevertError::Request(e) => e.into_status(),
            crate::decider::RevertError::Rules(e) => e.into_status(),
        }
    }
}

/// `result.or_status()?` in a handler that answers a [`Status`].
pub(crate) trait OrStatus<T> {
    fn or_status(self) -> Result<T, Status>;
}

impl<T, E: IntoStatus> OrStatus<T> for Result<T, E> {
    fn or_status(self) -> Result<T, Status> {
        self.map_err(IntoStatus::into_status)
    }
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        let code = match &r {
            Refusal::TooManyWatchers { .. }
            | Refusal::TooManyQuotaStreams { .. }
            | Refusal::TooLarge { .. }
            | Refusal::Unfinished { .. } => tonic::Code::ResourceExhausted,
            Refusal::NoSuchMethod => tonic::Code::Unimplemented,
            Refusal::Denied(Denied::Unauthenticated(_)) => tonic::Code::Unauthenticated,
            Refusal::Denied(Denied::PermissionDenied(_)) => tonic::Code::PermissionDenied,
        };
        Status::new(code, r.to_string())
    }
}

/// An error reading a client's stream, as the client is told it: a message
/// over the method's limit is RESOURCE_EXHAUSTED, as for unary calls (tonic
/// says OUT_OF_RANGE); others as they are.
pub(crate) fn stream_error(e: Status) -> Status {
    if e.code() == tonic::Code::OutOfRange { Status::resource_exhausted(e.message().to_string()) } else { e }
}
