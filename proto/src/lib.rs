//! Generated gRPC stubs for Floodgate.
//!
//! - [`floodgate::v1`]: the `Floodgate` data plane and the `Admin` control plane.
//! - [`codec`]: prost's codec, with undecodable input answered INVALID_ARGUMENT.
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

pub use floodgate::v1;
