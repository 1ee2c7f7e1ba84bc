//! Test certificates made on the spot (rcgen): a CA, server certificates for
//! localhost and 127.0.0.1, and client certificates by common name.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct Pki {
    pub dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM text and as files.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), issuer.pem()).unwrap();
        Pki { dir, issuer }
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for localhost and 127.0.0.1, written as `file`.pem / `file`.key.
    pub fn server(&self, file: &str, cn: &str) -> Pair {
        self.issue(file, cn, vec!["localhost".into(), "127.0.0.1".into()])
    }

    /// A client certificate with this common name.
    pub fn client(&self, file: &str, cn: &str) -> Pair {
        self.issue(file, cn, Vec::new())
    }

    /// A client certificate with no name at all (an organisation only).
    pub fn nameless(&self, file: &str) -> Pair {
        self.issue(file, "", Vec::new())
    }

    fn issue(&self, file: &str, cn: &str, sans: Vec<String>) -> Pair {
        let mut params = CertificateParams::new(sans).unwrap();
        match cn {
            "" => params.distinguished_name.push(DnType::OrganizationName, "nameless"),
            cn => params.distinguished_name.push(DnType::CommonName, cn),
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        let cert = self.dir.path().join(format!("{file}.pem"));
        let key = self.dir.path().join(format!("{file}.key"));
        std::fs::write(&cert, &cert_pem).unwrap();
        std::fs::write(&key, &key_pem).unwrap();
        Pair { cert_pem, key_pem, cert, key }
    }
}
