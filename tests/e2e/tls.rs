//! TLS and mTLS on both ports of the real binary, with certificates made on
//! the spot: plaintext is refused, a client without a certificate is refused
//! under mTLS, a renewed certificate is served without a restart, and the
//! client crate and the CLI speak TLS.

use crate::support;

use std::time::Duration;

use floodgate_proto::v1 as pb;
use support::pki::Pki;
use support::*;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

async fn tls_channel(addr: &str, ca: &str, client: Option<(&str, &str)>) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

async fn health(channel: Channel) -> Result<i32, tonic::Status> {
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
    Ok(h.check(tonic_health::pb::HealthCheckRequest::default()).await?.into_inner().status)
}

/// The certificate the server presents on a new connection (its common name).
async fn served_name(addr: &str, ca: &str) -> String {
    use rustls::pki_types::ServerName;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string()
}

use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn tls_serves_both_ports_refuses_plaintext_and_reloads_a_renewed_certificate() {
    let pki = Pki::new("floodgate");
    let server = pki.server("server", "floodgate-1");
    let fg = floodgate().args(["--tls-cert", path_str(&server.cert), "--tls-key", path_str(&server.key)]).start();
    let ca = pki.ca_pem();

    assert_eq!(health(tls_channel(&fg.grpc, &ca, None).await.unwrap()).await.unwrap(), 1, "SERVING over TLS");
    let plain = Endpoint::from_shared(fg.url()).unwrap().connect_timeout(Duration::from_secs(3)).connect().await;
    let refused = match plain {
        Ok(channel) => health(channel).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "plaintext gRPC must not be served on a TLS port");
    assert_eq!(served_name(&fg.http, &ca).await, "floodgate-1", "the HTTP port speaks TLS too");

    // A log written beside the certificate, ten times a second: it neither
    // reloads TLS nor keeps a renewal waiting for a quiet second.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = server.cert.parent().unwrap().join("app.log");
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                writeln!(f, "a line of the application's log").unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!fg.logs().contains("TLS certificate reloaded"), "a neighbour's writes reloaded TLS: {}", fg.logs());

    // Renew the certificate in place: new connections get the new one.
    let renewed = pki.server("renewed", "floodgate-2");
    std::fs::copy(&renewed.key, &server.key).unwrap();
    std::fs::copy(&renewed.cert, &server.cert).unwrap();
    let name = eventually("the renewed certificate", Duration::from_secs(15), || async {
        let name = served_name(&fg.grpc, &ca).await;
        (name == "floodgate-2").then_some(name)
    })
    .await;
    assert_eq!(name, "floodgate-2");
    // Each port reloads once; the log, still written, adds nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reloads = fg.logs().matches("TLS certificate reloaded").count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(fg.logs().matches("TLS certificate reloaded").count(), reloads, "{}", fg.logs());
    assert!(reloads <= 2, "one reload for each of the two ports: {}", fg.logs());
}

#[tokio::test]
async fn mtls_needs_a_client_certificate_from_the_ca() {
    let pki = Pki::new("floodgate");
    let server = pki.server("server", "floodgate");
    let client = pki.client("client", "payments-service");
    let stranger = Pki::new("other").client("stranger", "mallory");
    let fg = floodgate()
        .args([
            "--tls-cert",
            path_str(&server.cert),
            "--tls-key",
            path_str(&server.key),
            "--tls-client-ca",
            path_str(&pki.ca_path()),
        ])
        .start();
    let ca = pki.ca_pem();
    let with_cert = tls_channel(&fg.grpc, &ca, Some((&client.cert_pem, &client.key_pem))).await.unwrap();
    let mut data = pb::floodgate_client::FloodgateClient::new(with_cert);
    let r = data.acquire(acquire("demo", &[("user", "u1")], 1)).await.unwrap().into_inner();
    assert_eq!(r.verdict(), pb::Verdict::Allowed);
    for who in [None, Some((&stranger.cert_pem, &stranger.key_pem))] {
        let refused = match tls_channel(&fg.grpc, &ca, who.map(|(c, k)| (c.as_str(), k.as_str()))).await {
            Ok(channel) => health(channel).await.is_err(),
            Err(_) => true,
        };
        assert!(refused, "a client without a certificate from the CA must be refused");
    }
}

#[tokio::test]
async fn the_client_crate_and_the_cli_speak_tls() {
    let pki = Pki::new("floodgate");
    let server = pki.server("server", "floodgate");
    let client = pki.client("client", "cli");
    let fg = floodgate()
        .args([
            "--tls-cert",
            path_str(&server.cert),
            "--tls-key",
            path_str(&server.key),
            "--tls-client-ca",
            path_str(&pki.ca_path()),
        ])
        .start();
    let tls = floodgate_client::Tls::new()
        .ca_pem(pki.ca_pem())
        .identity_pem(client.cert_pem.clone(), client.key_pem.clone())
        .domain("localhost");
    let c = floodgate_client::Client::builder()
        .endpoint(format!("https://{}", fg.grpc))
        .tls(tls)
        .request_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let d = c.acquire(&floodgate_client::Acquire::new("demo").descriptor("user", "u9")).await.unwrap();
    assert_eq!(d.source, floodgate_client::decision::Source::Server, "answered by the server, not failed open");

    let out = std::process::Command::new(BIN)
        .args(["acquire", "--server", &format!("https://{}", fg.grpc), "demo", "-d", "user=u8"])
        .args(["--ca", path_str(&pki.ca_path()), "--cert", path_str(&client.cert), "--key", path_str(&client.key)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ALLOWED"));
}

const ORIGIN_RULES: &str = r#"
resources:
  - name: metered
    limits: [ { name: per-origin, key: [origin], algorithm: fixed_window, limit: 2, window: 1h } ]
  - name: guarded
    origins: { key: origin, deny: [app-b] }
"#;

/// A server under mTLS with `ORIGIN_RULES`, and a Floodgate client for a
/// certificate named `name` (made by `pki`).
async fn origin_server(extra: &[&str]) -> (Pki, Floodgate) {
    let pki = Pki::new("floodgate");
    let server = pki.server("server", "floodgate");
    let mut args = vec![
        "--tls-cert".to_string(),
        server.cert.display().to_string(),
        "--tls-key".to_string(),
        server.key.display().to_string(),
        "--tls-client-ca".to_string(),
        pki.ca_path().display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let fg = floodgate().rules(ORIGIN_RULES).args(args).start();
    (pki, fg)
}

async fn as_caller(pki: &Pki, fg: &Floodgate, name: &str) -> pb::floodgate_client::FloodgateClient<Channel> {
    let who = pki.client(name, name);
    let channel = tls_channel(&fg.grpc, &pki.ca_pem(), Some((&who.cert_pem, &who.key_pem))).await.unwrap();
    pb::floodgate_client::FloodgateClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mtls_a_caller_cannot_spend_another_origins_quota_or_pass_its_deny_list() {
    let (pki, fg) = origin_server(&[]).await;
    let mut app_a = as_caller(&pki, &fg, "app-a").await;
    let mut app_b = as_caller(&pki, &fg, "app-b").await;
    // app-a names app-b twice: its own quota (2) is what it spends.
    for expected in [pb::Verdict::Allowed, pb::Verdict::Allowed, pb::Verdict::RateLimited] {
        let answer = app_a.acquire(acquire("metered", &[("origin", "app-b")], 1)).await.unwrap().into_inner();
        assert_eq!(answer.verdict(), expected, "{answer:?}");
    }
    let answer = app_b.acquire(acquire("metered", &[("origin", "app-b")], 1)).await.unwrap().into_inner();
    assert_eq!(
        (answer.verdict(), answer.limits[0].remaining),
        (pb::Verdict::Allowed, 1),
        "app-b's own quota: {answer:?}"
    );
    // app-b is denied however it names itself, or if it names nothing.
    for descriptors in [&[][..], &[("origin", "app-a")][..], &[("origin", "")][..]] {
        let answer = app_b.acquire(acquire("guarded", descriptors, 1)).await.unwrap().into_inner();
        assert_ne!(answer.verdict(), pb::Verdict::Allowed, "app-b passed its deny list with {descriptors:?}");
    }
    let answer = app_a.acquire(acquire("guarded", &[("origin", "app-b")], 1)).await.unwrap().into_inner();
    assert_eq!(answer.verdict(), pb::Verdict::Allowed, "app-a is not app-b, whatever it says");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insecure_flag_lets_callers_name_their_origin() {
    let (pki, fg) = origin_server(&["--insecure-callers-name-their-origin"]).await;
    let mut app_a = as_caller(&pki, &fg, "app-a").await;
    let answer = app_a.acquire(acquire("metered", &[("origin", "app-b")], 2)).await.unwrap().into_inner();
    assert_eq!(answer.verdict(), pb::Verdict::Allowed);
    let answer = app_a.acquire(acquire("metered", &[("origin", "app-b")], 1)).await.unwrap().into_inner();
    assert_eq!(answer.verdict(), pb::Verdict::RateLimited, "app-b's quota, spent by app-a as the flag allows");
}
