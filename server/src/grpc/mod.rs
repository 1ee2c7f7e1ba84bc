//! The gRPC surface: translation between proto and domain, nothing else.

use std::sync::Arc;

use floodgate_proto::v1::admin_server::AdminServer;
use tonic::service::RoutesBuilder;
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::access::Access;
use crate::decider::Decider;

mod admin;
pub(crate) mod convert;
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

/// Every gRPC service on one port: data plane, control plane (behind its
/// gate), Envoy's RLS v3, health and reflection (v1 and v1alpha, so grpcurl
/// and other clients work).
pub fn routes<H>(
    decider: Arc<Decider>,
    health: HealthServer<H>,
    access: Arc<Access>,
    max_watchers: usize,
) -> anyhow::Result<tonic::service::Routes>
where
    H: Health,
{
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(floodgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let mut routes = RoutesBuilder::default();
    // Per-method caps are checked first (SizeLayer); tonic's own limit is
    // only a backstop above the largest.
    let cap = rpc::largest_cap() * 2;
    let admin = AdminServer::new(ControlPlane::new(decider.clone())).max_decoding_message_size(cap);
    routes
        .add_service(DataPlaneService::new(decider.clone(), max_watchers, cap))
        .add_service(AdminGate::new(admin, access))
        .add_service(EnvoyRls::new(decider.clone()))
        .add_service(rlqs::Rlqs::server(decider, cap))
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?);
    Ok(routes.routes())
}
