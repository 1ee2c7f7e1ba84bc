//! Every RPC the gRPC port serves, in one table: its path, its metric label,
//! its request size cap and who may call it. The layers in front of the
//! services (`observe`, `size`, `gate`) read this table and nothing else, so
//! an RPC is registered in one row: a row missing a column does not compile,
//! and a test checks the table against the served services' descriptors, so
//! an RPC added to a proto but not here fails it by name.

use crate::access::Role;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// The cap of a request that carries one small question.
pub(crate) const SMALL: usize = 64 * KIB;

/// Who may make a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Anyone who reaches the port (the data plane, health, reflection).
    Anyone,
    /// An Admin caller with this role (see [`access`](crate::access)).
    Admin(Role),
}

macro_rules! rpcs {
    ($($rpc:ident: $path:literal, $label:literal, $cap:expr, $caller:expr;)*) => {
        /// An RPC served on the gRPC port.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Rpc {
            $($rpc),*
        }

        impl Rpc {
            /// Every RPC, in table order (`rpc as usize` is its position).
            pub const ALL: &'static [Rpc] = &[$(Rpc::$rpc),*];

            /// The HTTP/2 path it is called on.
            pub fn path(self) -> &'static str {
                match self {
                    $(Rpc::$rpc => $path),*
                }
            }

            /// Its `method` label in metrics and traces.
            pub fn label(self) -> &'static str {
                match self {
                    $(Rpc::$rpc => $label),*
                }
            }

            /// The largest request body it takes, checked before decoding.
            pub fn cap(self) -> usize {
                match self {
                    $(Rpc::$rpc => $cap),*
                }
            }

            /// Who may call it.
            pub fn caller(self) -> Caller {
                match self {
                    $(Rpc::$rpc => $caller),*
                }
            }

            /// The RPC at `path`, if the port serves one there.
            pub(crate) fn from_path(path: &str) -> Option<Rpc> {
                match path {
                    $($path => Some(Rpc::$rpc),)*
                    _ => None,
                }
            }
        }
    };
}

use Caller::{Admin, Anyone};
use Role::{Admin as Change, Read};

rpcs! {
    Acquire: "/floodgate.v1.Floodgate/Acquire", "Floodgate/Acquire", SMALL, Anyone;
    AcquireBatch: "/floodgate.v1.Floodgate/AcquireBatch", "Floodgate/AcquireBatch", 4 * MIB, Anyone;
    ReportOutcome: "/floodgate.v1.Floodgate/ReportOutcome", "Floodgate/ReportOutcome", 16 * KIB, Anyone;
    ReportOutcomeBatch: "/floodgate.v1.Floodgate/ReportOutcomeBatch", "Floodgate/ReportOutcomeBatch", MIB, Anyone;
    Charge: "/floodgate.v1.Floodgate/Charge", "Floodgate/Charge", SMALL, Anyone;
    Lease: "/floodgate.v1.Floodgate/Lease", "Floodgate/Lease", SMALL, Anyone;
    ReportLoad: "/floodgate.v1.Floodgate/ReportLoad", "Floodgate/ReportLoad", 4 * KIB, Anyone;
    Watch: "/floodgate.v1.Floodgate/Watch", "Floodgate/Watch", SMALL, Anyone;
    GetRules: "/floodgate.v1.Admin/GetRules", "Admin/GetRules", SMALL, Admin(Read);
    ApplyRules: "/floodgate.v1.Admin/ApplyRules", "Admin/ApplyRules", crate::rules::bounds::MAX_BYTES + 64 * KIB, Admin(Change);
    ListBreakers: "/floodgate.v1.Admin/ListBreakers", "Admin/ListBreakers", SMALL, Admin(Read);
    GetBreaker: "/floodgate.v1.Admin/GetBreaker", "Admin/GetBreaker", SMALL, Admin(Read);
    GetConcurrency: "/floodgate.v1.Admin/GetConcurrency", "Admin/GetConcurrency", SMALL, Admin(Read);
    SetBreakerState: "/floodgate.v1.Admin/SetBreakerState", "Admin/SetBreakerState", SMALL, Admin(Change);
    SetDegradationLevel: "/floodgate.v1.Admin/SetDegradationLevel", "Admin/SetDegradationLevel", SMALL, Admin(Change);
    Peek: "/floodgate.v1.Admin/Peek", "Admin/Peek", SMALL, Admin(Read);
    GetWhatIf: "/floodgate.v1.Admin/GetWhatIf", "Admin/GetWhatIf", SMALL, Admin(Read);
    // Up to 10,000 overrides or ids per call.
    SetOverrides: "/floodgate.v1.Admin/SetOverrides", "Admin/SetOverrides", 8 * MIB, Admin(Change);
    ListOverrides: "/floodgate.v1.Admin/ListOverrides", "Admin/ListOverrides", SMALL, Admin(Read);
    DeleteOverrides: "/floodgate.v1.Admin/DeleteOverrides", "Admin/DeleteOverrides", 2 * MIB, Admin(Change);
    GetTopKeys: "/floodgate.v1.Admin/GetTopKeys", "Admin/GetTopKeys", SMALL, Admin(Read);
    GetDecisions: "/floodgate.v1.Admin/GetDecisions", "Admin/GetDecisions", SMALL, Admin(Read);
    SetDecisionLog: "/floodgate.v1.Admin/SetDecisionLog", "Admin/SetDecisionLog", SMALL, Admin(Change);
    AdjustBalance: "/floodgate.v1.Admin/AdjustBalance", "Admin/AdjustBalance", SMALL, Admin(Change);
    RevertRules: "/floodgate.v1.Admin/RevertRules", "Admin/RevertRules", SMALL, Admin(Change);
    GetTraffic: "/floodgate.v1.Admin/GetTraffic", "Admin/GetTraffic", SMALL, Admin(Read);
    ProposeLimit: "/floodgate.v1.Admin/ProposeLimit", "Admin/ProposeLimit", SMALL, Admin(Read);
    HealthCheck: "/grpc.health.v1.Health/Check", "Health/Check", SMALL, Anyone;
    HealthWatch: "/grpc.health.v1.Health/Watch", "Health/Watch", SMALL, Anyone;
    Reflection: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "ServerReflection/ServerReflectionInfo", SMALL, Anyone;
    ReflectionAlpha: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "ServerReflection.v1alpha/ServerReflectionInfo", SMALL, Anyone;
    ShouldRateLimit: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "RateLimitService/ShouldRateLimit", MIB, Anyone;
    StreamRateLimitQuotas: "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", "RateLimitQuotaService/StreamRateLimitQuotas", MIB, Anyone;
}

impl Rpc {
    /// Whether the client sends a stream of messages (the size cap is then
    /// per message).
    pub(crate) fn client_streaming(self) -> bool {
        matches!(self, Rpc::Reflection | Rpc::ReflectionAlpha | Rpc::StreamRateLimitQuotas)
    }
}

/// The cap for a path the table does not know: the smallest.
pub(crate) const UNKNOWN_CAP: usize = SMALL;

/// The largest cap of any RPC: tonic's own decoding limit sits above it, as
/// a backstop.
pub fn largest_cap() -> usize {
    Rpc::ALL.iter().map(|r| r.cap()).max().unwrap_or(SMALL)
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_types::FileDescriptorSet;

    use super::*;

    /// Every method of the services these descriptor sets define, as paths.
    fn paths(sets: &[&[u8]]) -> Vec<String> {
        methods(sets).into_iter().map(|(path, _)| path).collect()
    }

    /// Every method of the services these descriptor sets define, as paths,
    /// with whether the client streams.
    fn methods(sets: &[&[u8]]) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for set in sets {
            let set = FileDescriptorSet::decode(*set).expect("a descriptor set");
            for file in set.file {
                let package = file.package.unwrap_or_default();
                for service in file.service {
                    let name = service.name.unwrap_or_default();
                    for method in service.method {
                        let streams = method.client_streaming.unwrap_or(false);
                        out.push((format!("/{package}.{name}/{}", method.name.unwrap_or_default()), streams));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_served_method_has_a_row() {
        let served = paths(&[
            floodgate_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]);
        assert!(served.len() > 20, "{served:?}");
        let missing: Vec<&String> = served.iter().filter(|p| Rpc::from_path(p).is_none()).collect();
        assert!(missing.is_empty(), "RPCs served but not in grpc/rpc.rs: {missing:?}");
        // Envoy's services come without descriptors: their one method each.
        for service in [
            envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME,
            envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::SERVICE_NAME,
        ] {
            assert!(Rpc::ALL.iter().any(|r| r.path().starts_with(&format!("/{service}/"))), "{service}");
        }
    }

    #[test]
    fn the_table_knows_which_clients_stream() {
        let served = methods(&[
            floodgate_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]);
        for (path, streams) in served {
            assert_eq!(Rpc::from_path(&path).map(Rpc::client_streaming), Some(streams), "{path}");
        }
        // Envoy's: RLQS streams, RLS does not.
        assert!(Rpc::StreamRateLimitQuotas.client_streaming() && !Rpc::ShouldRateLimit.client_streaming());
    }

    #[test]
    fn admin_methods_and_only_they_need_a_role() {
        for rpc in Rpc::ALL {
            let admin = rpc.path().starts_with("/floodgate.v1.Admin/");
            assert_eq!(admin, matches!(rpc.caller(), Caller::Admin(_)), "{rpc:?}");
            // A call named like a read must not change anything, and the
            // reverse (a proposal changes nothing: it is read).
            let reads = ["/Get", "/List", "/Peek", "/Propose"].iter().any(|p| rpc.path().contains(p));
            if admin {
                assert_eq!(reads, rpc.caller() == Caller::Admin(Role::Read), "{rpc:?}");
            }
        }
    }

    #[test]
    fn rows_are_in_order_and_distinct() {
        for (i, rpc) in Rpc::ALL.iter().enumerate() {
            assert_eq!(*rpc as usize, i);
            assert_eq!(Rpc::from_path(rpc.path()), Some(*rpc));
        }
        let mut labels: Vec<&str> = Rpc::ALL.iter().map(|r| r.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Rpc::ALL.len(), "labels are distinct");
        assert_eq!(largest_cap(), Rpc::ApplyRules.cap().max(Rpc::SetOverrides.cap()));
    }
}
