//! Every error becomes a gRPC status here, and only here.

use tonic::Status;

use crate::engine::RequestError;
use crate::rules::RuleErrors;

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Status {
        match e {
            RequestError::NoBreaker(_) | RequestError::NoSuchLimit { .. } | RequestError::NoWhatIf => {
                Status::not_found(e.to_string())
            }
            RequestError::TooManyOverrides { .. } => Status::resource_exhausted(e.to_string()),
            RequestError::OverridesNotKept(_) => Status::unavailable(e.to_string()),
            e => Status::invalid_argument(e.to_string()),
        }
    }
}

impl From<RuleErrors> for Status {
    fn from(e: RuleErrors) -> Status {
        Status::invalid_argument(e.to_string())
    }
}
