//! The client's errors: only what the caller can act on. A server that cannot
//! be reached is not an error: the client fails open or closed as configured.

/// Why a question could not be answered, or a client not built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request as bad input; the message names the field.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server answered with another error.
    #[error("Floodgate: {0}")]
    Server(tonic::Status),
    /// The client could not be built (a bad endpoint address).
    #[error("bad endpoint '{endpoint}': {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// A setting the client cannot use.
    #[error("{0}")]
    Config(String),
    /// A layer was given a header or metadata name that cannot be one.
    #[error("'{name}' is not a valid header name")]
    InvalidHeader { name: String },
    /// The server answered something the protocol does not allow (a batch
    /// answered with fewer or more answers than questions).
    #[error("the server's answer breaks the protocol: {0}")]
    Protocol(String),
}

/// A header (or gRPC metadata) name, checked.
pub(crate) fn header_name(name: &str) -> Result<http::HeaderName, Error> {
    http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| Error::InvalidHeader { name: name.into() })
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Error {
        match s.code() {
            tonic::Code::InvalidArgument => Error::InvalidArgument(s.message().to_string()),
            _ => Error::Server(s),
        }
    }
}

/// Whether a gRPC status means the server could not be reached (rather than
/// that it answered).
pub(crate) fn unreachable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}
