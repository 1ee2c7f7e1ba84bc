//! The gRPC surface: translation between proto and domain, nothing else.

use std::sync::Arc;

use floodgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use floodgate_proto::v1::admin_server::AdminServer;
use floodgate_proto::v1::floodgate_server::FloodgateServer;
use tonic::service::RoutesBuilder;
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::decider::Decider;

mod admin;
mod convert;
mod data;
mod envoy;
mod observe;
mod status;
mod watch;

pub use admin::ControlPlane;
pub use data::DataPlane;
pub use envoy::EnvoyRls;
pub use observe::ObserveLayer;

/// Every gRPC service on one port: data plane, control plane, Envoy's RLS v3,
/// health and reflection (v1 and v1alpha, so grpcurl and other clients work).
pub fn routes<H>(decider: Arc<Decider>, health: HealthServer<H>) -> anyhow::Result<tonic::service::Routes>
where
    H: Health,
{
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floodgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let mut routes = RoutesBuilder::default();
    routes
        .add_service(FloodgateServer::new(DataPlane::new(decider.clone())))
        .add_service(AdminServer::new(ControlPlane::new(decider.clone())))
        .add_service(RateLimitServiceServer::new(EnvoyRls::new(decider)))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?);
    Ok(routes.routes())
}
