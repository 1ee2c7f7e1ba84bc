//! TLS (and mTLS) for both ports with rustls: the certificate, key and client
//! CA are read at start and again whenever they change, so a renewed
//! certificate is served without a restart. A file that cannot be read or
//! parsed is logged and the configuration in force stays.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

/// Where the server's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// The configuration in force for one port.
pub struct Tls {
    /// The port it serves, for the logs: "gRPC" or "HTTP".
    port: &'static str,
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    current: ArcSwap<ServerConfig>,
}

impl Tls {
    /// Reads the files for `port` (its name in the logs); `alpn` names the
    /// protocols the port speaks.
    pub fn load(port: &'static str, files: TlsFiles, alpn: &[&[u8]]) -> anyhow::Result<Arc<Tls>> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let config = server_config(&files, &alpn)?;
        Ok(Arc::new(Tls { port, files, alpn, current: ArcSwap::from_pointee(config) }))
    }

    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// Reads the files again when they change, until the task is aborted.
    pub fn watch(self: &Arc<Self>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let mut paths = vec![self.files.cert.clone(), self.files.key.clone()];
        paths.extend(self.files.client_ca.clone());
        let weak = Arc::downgrade(self);
        crate::files::watch(paths, crate::files::QUIET, move || {
            let weak = weak.clone();
            async move {
                let Some(tls) = weak.upgrade() else { return };
                let (files, alpn) = (tls.files.clone(), tls.alpn.clone());
                match tokio::task::spawn_blocking(move || server_config(&files, &alpn)).await {
                    Ok(Ok(config)) => {
                        tls.current.store(Arc::new(config));
                        tracing::info!(port = tls.port, cert = %tls.files.cert.display(), "TLS certificate reloaded");
                    }
                    Ok(Err(e)) => tracing::error!(
                        port = tls.port,
                        error = format!("{e:#}"),
                        "TLS files not reloaded; keeping the ones in force"
                    ),
                    Err(e) => tracing::error!(port = tls.port, error = %e, "TLS files not reloaded"),
                }
            }
        })
    }
}

/// The largest certificate, key or CA file read (a CA bundle of the whole
/// web's roots is about 200 KiB).
const MAX_PEM_BYTES: usize = 4 << 20;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(files: &TlsFiles, alpn: &[Vec<u8>]) -> anyhow::Result<ServerConfig> {
    let read = |path: &std::path::Path| {
        crate::files::read_file(path, MAX_PEM_BYTES).with_context(|| format!("reading {}", path.display()))
    };
    let certs = CertificateDer::pem_slice_iter(&read(&files.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", files.cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", files.cert.display());
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .with_context(|| format!("reading a private key from {}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(ca)?) {
                roots.add(cert.with_context(|| format!("reading {}", ca.display()))?)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .with_context(|| format!("client CA {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("the key {} and its certificate", files.key.display()))?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}
