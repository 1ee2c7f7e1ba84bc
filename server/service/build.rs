//! Compiles Envoy's rate limit services (RLS v3 and RLQS v3) into a
//! descriptor set, so that server reflection lists them beside Floodgate's
//! own services and grpcurl can call `ShouldRateLimit` without proto files.
//!
//! The protos come from the `envoy-types` crate, which ships them with its
//! generated code. Cargo does not tell a build script where another crate's
//! sources are, so this script looks for the version that Cargo.lock names in
//! the registry's source directories (and in a `vendor/` directory, for
//! vendored builds). When it finds none, it writes an empty set and says so
//! with a warning: the server then works as before, with reflection that
//! lists Floodgate's services only.

use std::path::{Path, PathBuf};

use prost::Message;

const PROTOS: &[&str] = &["envoy/service/ratelimit/v3/rls.proto", "envoy/service/rate_limit_quota/v3/rlqs.proto"];

/// The directories under the crate's `proto/` that the imports resolve from.
const INCLUDES: &[&str] = &["data-plane-api", "xds", "protoc-gen-validate", "googleapis", "cel-spec/proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy_descriptor.bin");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest.ancestors().nth(2).unwrap_or(&manifest).to_path_buf();
    println!("cargo:rerun-if-changed={}", workspace.join("Cargo.lock").display());
    let Some(root) = envoy_types_protos(&workspace) else {
        println!("cargo:warning=envoy-types' protos were not found: reflection will not list Envoy's services");
        std::fs::write(&out, [])?;
        return Ok(());
    };
    let includes: Vec<PathBuf> = INCLUDES.iter().map(|i| root.join(i)).collect();
    let fds = protox::compile(PROTOS, &includes)?;
    std::fs::write(&out, fds.encode_to_vec())?;
    Ok(())
}

/// The `proto/` directory of the envoy-types version in Cargo.lock.
fn envoy_types_protos(workspace: &Path) -> Option<PathBuf> {
    let lock = std::fs::read_to_string(workspace.join("Cargo.lock")).ok()?;
    let mut lines = lock.lines();
    lines.find(|l| l.trim() == "name = \"envoy-types\"")?;
    let version = lines.next()?.trim().strip_prefix("version = \"")?.strip_suffix('"')?.to_string();
    let dir = format!("envoy-types-{version}");
    let mut candidates = vec![workspace.join("vendor").join("envoy-types"), workspace.join("vendor").join(&dir)];
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(home) = home
        && let Ok(registries) = std::fs::read_dir(home.join("registry").join("src"))
    {
        candidates.extend(registries.flatten().map(|r| r.path().join(&dir)));
    }
    candidates.into_iter().map(|c| c.join("proto")).find(|p| p.join("data-plane-api").is_dir())
}
