//! The gRPC surface: translation between proto and domain, nothing else.

use std::sync::Arc;

use floodgate_proto::v1::admin_server::AdminServer;
use tonic::service::RoutesBuilder;
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::access::Access;
use crate::decider::Decider;

mod admin;
pub mod convert;
mod data;
mod envoy;
mod gate;
mod observe;
mod rlqs;
pub mod rpc;
mod serve;
pub mod size;
mod status;
mod unary;
mod watch;

pub use admin::ControlPlane;
pub use data::{DataPlane, DataPlaneService};
pub use envoy::EnvoyRls;
pub use gate::AdminGate;
pub use observe::ObserveLayer;
pub use serve::serve;
pub use size::SizeLayer;

/// Envoy's RLS v3 and RLQS v3 with every file they import, for reflection
/// (see build.rs; empty when the build did not find Envoy's protos).
const ENVOY_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptor.bin"));

/// Every gRPC service on one port: data plane, control plane (behind its
/// gate), Envoy's RLS v3, health and reflection (v1 and v1alpha, so grpcurl
/// and other clients work). The decision services are called straight from
/// their path ([`Dispatch`]); the others through tonic's router.
pub fn routes<H>(
    decider: Arc<Decider>,
    health: HealthServer<H>,
    access: Arc<Access>,
    max_watchers: usize,
) -> anyhow::Result<Dispatch>
where
    H: Health,
{
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floodgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(ENVOY_FILE_DESCRIPTOR_SET)
    };
    let mut routes = RoutesBuilder::default();
    // Per-method caps are checked first (SizeLayer); tonic's own limit is
    // only a backstop above the largest.
    let cap = rpc::largest_cap() * 2;
    let admin = AdminServer::new(ControlPlane::new(decider.clone())).max_decoding_message_size(cap);
    let data = DataPlaneService::new(decider.clone(), max_watchers, cap);
    let rls = EnvoyRls::new(decider.clone());
    routes
        .add_service(data.clone())
        .add_service(AdminGate::new(admin, access))
        .add_service(rls.clone())
        .add_service(rlqs::Rlqs::server(decider, cap))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?);
    Ok(Dispatch { data, rls, routes: routes.routes().prepare() })
}

/// The gRPC port's service: `Acquire`, `ShouldRateLimit` and the rest of
/// the data plane and RLS go straight to their service, chosen by the path
/// the router would match them by (`/{service}/{method}`), without the
/// router's conversions of each request and answer body; everything else
/// goes through tonic's router. Both ways reach the same services, so an
/// unknown method of either service is answered by it as before.
#[derive(Clone)]
pub struct Dispatch {
    data: DataPlaneService,
    rls: EnvoyRls,
    routes: tonic::service::Routes,
}

/// What [`Dispatch`] answers with. The router's future is kept in place
/// (boxing it would cost the routed calls an allocation each; the size is
/// the router's future's either way).
#[allow(clippy::large_enum_variant)]
pub enum DispatchFuture {
    Direct(tonic::codegen::BoxFuture<http::Response<tonic::body::Body>, std::convert::Infallible>),
    Routed(RoutesFuture),
}

/// tonic's router's future (its type is not exported by name).
type RoutesFuture = <tonic::service::Routes as tower::Service<http::Request<tonic::body::Body>>>::Future;

impl std::future::Future for DispatchFuture {
    type Output = Result<http::Response<tonic::body::Body>, std::convert::Infallible>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            DispatchFuture::Direct(f) => f.as_mut().poll(cx),
            DispatchFuture::Routed(f) => std::pin::Pin::new(f).poll(cx),
        }
    }
}

/// Whether `path` is a method of service `name`: `/{name}/{method}`.
fn is_method_of(path: &str, name: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(name))
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|method| !method.is_empty())
}

impl<B> tower::Service<http::Request<B>> for Dispatch
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = DispatchFuture;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        use tonic::server::NamedService;
        let path = req.uri().path();
        if is_method_of(path, DataPlaneService::NAME) {
            DispatchFuture::Direct(self.data.call(req.map(tonic::body::Body::new)))
        } else if is_method_of(path, EnvoyRls::NAME) {
            DispatchFuture::Direct(self.rls.call(req.map(tonic::body::Body::new)))
        } else {
            DispatchFuture::Routed(self.routes.call(req))
        }
    }
}

#[cfg(test)]
mod dispatch_tests {
    use super::is_method_of;

    #[test]
    fn a_method_is_its_services_only_with_a_name_after_the_slash() {
        let name = "floodgate.v1.DataPlane";
        assert!(is_method_of("/floodgate.v1.DataPlane/Acquire", name));
        assert!(is_method_of("/floodgate.v1.DataPlane/Nope", name));
        for other in [
            "/floodgate.v1.DataPlane/",
            "/floodgate.v1.DataPlane",
            "/floodgate.v1.DataPlaneX/Acquire",
            "floodgate.v1.DataPlane/Acquire",
            "/floodgate.v1.Admin/GetRules",
            "/",
        ] {
            assert!(!is_method_of(other, name), "{other}");
        }
    }
}
