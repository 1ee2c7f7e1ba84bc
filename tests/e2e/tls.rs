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

/// One JSON call over HTTPS/1.1 with the client certificate `who` (made by
/// the test's PKI): (status, body); `Err` when the handshake or the call
/// failed.
async fn json_call(
    addr: &str,
    ca: &str,
    who: Option<(&str, &str)>,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match who {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut tls =
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.map_err(|e| e.to_string())?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("no status in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// The JSON API on the HTTP port takes the caller's origin from its client
/// certificate as gRPC does: a caller naming another origin spends its own
/// quota (the same bucket as its gRPC calls), a denied origin is denied
/// however it names itself, and a caller without a certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mtls_json_calls_carry_the_certificates_origin() {
    let (pki, fg) = origin_server(&[]).await;
    let ca = pki.ca_pem();
    let (a, b) = (pki.client("app-a", "app-a"), pki.client("app-b", "app-b"));
    let app_a = Some((a.cert_pem.as_str(), a.key_pem.as_str()));
    let app_b = Some((b.cert_pem.as_str(), b.key_pem.as_str()));
    let naming_b = r#"{"resource":"metered","descriptors":{"origin":"app-b"}}"#;

    // app-a's first call over JSON, its second over gRPC, its third over
    // JSON again: one quota of 2, app-a's.
    let (status, body) = json_call(&fg.http, &ca, app_a, "/v1/acquire", naming_b).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["verdict"], "VERDICT_ALLOWED", "{body}");
    let mut grpc_a = as_caller(&pki, &fg, "app-a").await;
    let answer = grpc_a.acquire(acquire("metered", &[("origin", "app-b")], 1)).await.unwrap().into_inner();
    assert_eq!(answer.verdict(), pb::Verdict::Allowed, "{answer:?}");
    let (_, body) = json_call(&fg.http, &ca, app_a, "/v1/acquire", naming_b).await.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["verdict"],
        "VERDICT_RATE_LIMITED",
        "app-a's quota is spent: {body}"
    );
    // app-b's own quota is untouched.
    let (_, body) = json_call(&fg.http, &ca, app_b, "/v1/acquire", naming_b).await.unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (answer["verdict"].as_str(), answer["limits"][0]["remaining"].as_str()),
        (Some("VERDICT_ALLOWED"), Some("1")),
        "{body}"
    );

    // app-b is denied on `guarded` whatever it names; app-a is not app-b.
    for named in [r#"{}"#, r#"{"origin":"app-a"}"#] {
        let ask = format!(r#"{{"resource":"guarded","descriptors":{named}}}"#);
        let (_, body) = json_call(&fg.http, &ca, app_b, "/v1/acquire", &ask).await.unwrap();
        assert!(!body.contains("VERDICT_ALLOWED"), "app-b passed its deny list naming {named}: {body}");
    }
    let ask = r#"{"resource":"guarded","descriptors":{"origin":"app-b"}}"#;
    let (_, body) = json_call(&fg.http, &ca, app_a, "/v1/acquire", ask).await.unwrap();
    assert!(body.contains("VERDICT_ALLOWED"), "{body}");

    // Without a client certificate, no call is answered.
    let refused = json_call(&fg.http, &ca, None, "/v1/acquire", naming_b).await;
    assert!(refused.as_ref().map_or(true, |(status, _)| *status >= 400), "a caller without a certificate: {refused:?}");
}
