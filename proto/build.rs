//! Compiles the protos with `protox` (pure Rust), so no system `protoc` is needed,
//! and keeps the encoded descriptor set for server reflection.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &["floodgate/v1/floodgate.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed={}", root.join("floodgate").display());

    let fds = protox::compile(PROTOS, [&root])?;
    std::fs::write(out.join("descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
