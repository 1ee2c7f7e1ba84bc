//! The gate in front of the Admin service: every call needs a credential
//! whose role allows it (see [`access`](crate::access)). The caller it finds
//! goes on to the handler, for the audit line; a refusal is answered here,
//! UNAUTHENTICATED or PERMISSION_DENIED, and logged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::server::NamedService;
use tower::Service;

use super::rpc::{Caller, Rpc};
use super::status::Refusal;
use crate::access::{Access, Role};
use crate::listen::Peer;

#[derive(Clone)]
pub struct AdminGate<S> {
    inner: S,
    access: Arc<Access>,
}

impl<S> AdminGate<S> {
    pub fn new(inner: S, access: Arc<Access>) -> Self {
        AdminGate { inner, access }
    }
}

impl<S: NamedService> NamedService for AdminGate<S> {
    const NAME: &'static str = S::NAME;
}

/// The role a method needs: its row's in [`Rpc`]; an Admin path the table
/// does not know needs the most.
fn needs(path: &str) -> Role {
    match Rpc::from_path(path).map(Rpc::caller) {
        Some(Caller::Admin(role)) => role,
        Some(Caller::Anyone) | None => Role::Admin,
    }
}

impl<S, B> Service<http::Request<B>> for AdminGate<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let peer = req.extensions().get::<Peer>().cloned().unwrap_or_default();
        let path = req.uri().path().to_string();
        match self.access.check(needs(&path), crate::access::bearer(req.headers()), &peer) {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                Box::pin(self.inner.call(req))
            }
            Err(denied) => {
                let peer = peer.addr.map(|a| a.to_string()).unwrap_or_default();
                let status = tonic::Status::from(Refusal::Denied(denied));
                if let Some(suppressed) = self.access.refusal_logged() {
                    tracing::warn!(target: "floodgate::audit", peer, method = path, reason = status.message(), suppressed, "admin call refused");
                }
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}
