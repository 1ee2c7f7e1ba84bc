//! Generated gRPC stubs for Floodgate.
//!
//! - [`floodgate::v1`]: the `Floodgate` data plane and the `Admin` control plane.
//! - [`envoy`]: the wire-compatible subset of Envoy's rate limit service v3.
//! - [`FILE_DESCRIPTOR_SET`]: every compiled file, for server reflection.

#![allow(clippy::all, missing_docs)]

pub mod codec;

/// The encoded `FileDescriptorSet` of every proto in this crate, imports included.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

pub mod floodgate {
    pub mod v1 {
        tonic::include_proto!("floodgate.v1");
    }
}

pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

pub use floodgate::v1;
