//! Admin authorization through the real binary: bearer tokens with roles,
//! reloaded when the file changes; client certificate identities under mTLS;
//! read-only calls opened by a flag; loopback only without any credential; an
//! audit line for every change.

use crate::support;

use std::time::Duration;

use floodgate_proto::v1 as pb;
use pb::admin_client::AdminClient;
use support::pki::Pki;
use support::*;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Adds `authorization: Bearer TOKEN` when there is a token.
#[derive(Clone)]
struct Token(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.0 {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

type Admin = AdminClient<InterceptedService<Channel, Token>>;

fn with_token(channel: Channel, token: Option<&str>) -> Admin {
    AdminClient::with_interceptor(channel, Token(token.map(|t| format!("Bearer {t}").parse().unwrap())))
}

const RULES: &str =
    "resources: [ { name: orders, limits: [ { name: l, algorithm: gcra, rate_per_second: 10, burst: 10 } ] } ]\n";

async fn code_of<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[tokio::test]
async fn admin_needs_a_token_with_the_right_role_and_every_change_is_audited() {
    let dir = TempDir::new();
    let tokens =
        dir.write("tokens", "# ops\nadmin-token-0123456789 admin alice\nreader-token-0123456789 read grafana\n");
    let fg = floodgate().args(["--admin-token-file", path_str(&tokens)]).start();
    let ch = fg.channel().await;
    let apply = || pb::ApplyRulesRequest { yaml: RULES.into(), validate_only: false, ..Default::default() };

    let mut anonymous = with_token(ch.clone(), None);
    let err = anonymous.get_rules(pb::GetRulesRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert_eq!(code_of(anonymous.apply_rules(apply()).await).await, Code::Unauthenticated);
    assert_eq!(
        code_of(with_token(ch.clone(), Some("wrong-token-0123456789")).list_breakers(pb::ListBreakersRequest {}).await)
            .await,
        Code::Unauthenticated
    );

    let mut reader = with_token(ch.clone(), Some("reader-token-0123456789"));
    assert_eq!(code_of(reader.get_rules(pb::GetRulesRequest {}).await).await, Code::Ok);
    assert_eq!(code_of(reader.list_breakers(pb::ListBreakersRequest {}).await).await, Code::Ok);
    let err = reader.apply_rules(apply()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("token:grafana has the read role"), "{}", err.message());
    let level = pb::SetDegradationLevelRequest { level: 3, automatic: false, ..Default::default() };
    assert_eq!(code_of(reader.set_degradation_level(level).await).await, Code::PermissionDenied);
    // Overrides: reading them is for readers, changing them for admins.
    assert_eq!(code_of(reader.list_overrides(pb::ListOverridesRequest::default()).await).await, Code::Ok);
    let block = pb::Override {
        rule: "*".into(),
        when: [("ip".to_string(), "6.6.6.6".to_string())].into(),
        action: Some(pb::r#override::Action::Block(pb::Block::default())),
        ..Default::default()
    };
    let set = pb::SetOverridesRequest { overrides: vec![block] };
    assert_eq!(code_of(reader.set_overrides(set).await).await, Code::PermissionDenied);
    let delete = pb::DeleteOverridesRequest { ids: vec!["x".into()] };
    assert_eq!(code_of(reader.delete_overrides(delete).await).await, Code::PermissionDenied);
    assert_eq!(reader.get_rules(pb::GetRulesRequest {}).await.unwrap().into_inner().version, 1, "nothing changed");

    let mut alice = with_token(ch.clone(), Some("admin-token-0123456789"));
    assert_eq!(alice.apply_rules(apply()).await.unwrap().into_inner().version, 2);
    let logs = eventually("the audit line", Duration::from_secs(5), || async {
        let logs = fg.logs();
        logs.contains("change=\"ApplyRules\"").then_some(logs)
    })
    .await;
    let line = logs.lines().find(|l| l.contains("change=\"ApplyRules\"")).unwrap();
    for part in ["who=\"token:alice\"", "version_before=1", "version_after=2", "admin change"] {
        assert!(line.contains(part), "{part} missing from the audit line: {line}");
    }
    assert!(logs.contains("admin call refused"), "refusals are logged too");
    // A flood of bad tokens costs a counter, not a log line each.
    let mut flood = with_token(ch.clone(), Some("flood-token-0123456789"));
    for _ in 0..300 {
        assert_eq!(code_of(flood.get_rules(pb::GetRulesRequest {}).await).await, Code::Unauthenticated);
    }
    let refused = fg.logs().lines().filter(|l| l.contains("admin call refused")).count();
    assert!(refused <= 60, "{refused} lines for 300 refusals in a few seconds (10 a second at most)");

    // The data plane needs no token.
    let mut data = fg.client().await;
    assert_eq!(data.acquire(acquire("orders", &[], 1)).await.unwrap().into_inner().verdict(), pb::Verdict::Allowed);

    // A new token file: alice's token stops working, bob's starts.
    dir.replace("tokens", "bob-token-0123456789abc admin bob\n");
    eventually("bob's token", Duration::from_secs(15), || {
        let ch = ch.clone();
        async move {
            let ok =
                code_of(with_token(ch, Some("bob-token-0123456789abc")).get_rules(pb::GetRulesRequest {}).await).await;
            (ok == Code::Ok).then_some(())
        }
    })
    .await;
    assert_eq!(code_of(alice.get_rules(pb::GetRulesRequest {}).await).await, Code::Unauthenticated);
}

#[tokio::test]
async fn read_only_calls_can_be_opened_to_anyone() {
    let dir = TempDir::new();
    let tokens = dir.write("tokens", "admin-token-0123456789\n");
    let fg = floodgate().args(["--admin-token-file", path_str(&tokens), "--admin-read-open"]).start();
    let mut anonymous = with_token(fg.channel().await, None);
    assert_eq!(code_of(anonymous.get_rules(pb::GetRulesRequest {}).await).await, Code::Ok);
    let peek = pb::PeekRequest { resource: "demo".into(), ..Default::default() };
    assert_eq!(code_of(anonymous.peek(peek).await).await, Code::Ok);
    let set = pb::SetDegradationLevelRequest { level: 1, automatic: false, ..Default::default() };
    assert_eq!(code_of(anonymous.set_degradation_level(set).await).await, Code::Unauthenticated);
}

#[tokio::test]
async fn without_a_credential_admin_answers_on_loopback_and_says_so() {
    let fg = floodgate().start();
    let mut admin = fg.admin().await;
    assert_eq!(code_of(admin.get_rules(pb::GetRulesRequest {}).await).await, Code::Ok);
    assert!(fg.logs().contains("Admin answers only on loopback"), "{}", fg.logs());
}

#[tokio::test]
async fn an_empty_token_file_leaves_loopback_working_until_a_token_is_added() {
    let dir = TempDir::new();
    // As a Kubernetes Secret ships it: the file is there, with no token yet.
    let tokens = dir.write("tokens", "# add TOKEN [ROLE [NAME]] lines\n");
    let fg = floodgate().args(["--admin-token-file", path_str(&tokens)]).start();
    let ch = fg.channel().await;
    let mut anonymous = with_token(ch.clone(), None);
    assert_eq!(code_of(anonymous.get_rules(pb::GetRulesRequest {}).await).await, Code::Ok, "{}", fg.logs());
    assert!(fg.logs().contains("the admin token file has no token"), "{}", fg.logs());

    // Files written beside it (a log, an editor's swap file) reload nothing.
    for i in 0..5 {
        dir.write(&format!("beside-{i}.log"), "noise\n");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!fg.logs().contains("admin tokens reloaded"), "{}", fg.logs());

    // A token is added: loopback alone is no longer enough.
    dir.replace("tokens", "first-token-0123456789 admin carol\n");
    eventually("loopback to need the token", Duration::from_secs(15), || {
        let ch = ch.clone();
        async move {
            let code = code_of(with_token(ch, None).get_rules(pb::GetRulesRequest {}).await).await;
            (code == Code::Unauthenticated).then_some(())
        }
    })
    .await;
    let mut carol = with_token(ch.clone(), Some("first-token-0123456789"));
    assert_eq!(code_of(carol.get_rules(pb::GetRulesRequest {}).await).await, Code::Ok);
    assert_eq!(fg.logs().matches("admin tokens reloaded").count(), 1, "{}", fg.logs());
}

#[tokio::test]
async fn client_certificate_identities_carry_admin_roles_under_mtls() {
    let pki = Pki::new("floodgate");
    let server = pki.server("server", "floodgate");
    let ops = pki.client("ops", "ops-admin");
    let dashboards = pki.client("dashboards", "dashboards");
    let service = pki.client("service", "payments-service");
    let fg = floodgate()
        .args([
            "--tls-cert",
            path_str(&server.cert),
            "--tls-key",
            path_str(&server.key),
            "--tls-client-ca",
            path_str(&pki.ca_path()),
            "--admin-identity",
            "ops-admin",
            "--admin-identity",
            "dashboards=read",
        ])
        .start();
    let channel = |pair: &support::pki::Pair| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pki.ca_pem()))
            .identity(Identity::from_pem(&pair.cert_pem, &pair.key_pem))
            .domain_name("localhost");
        let endpoint = Endpoint::from_shared(format!("https://{}", fg.grpc)).unwrap().tls_config(tls).unwrap();
        async move { endpoint.connect().await.unwrap() }
    };
    let apply = || pb::ApplyRulesRequest { yaml: RULES.into(), validate_only: true, ..Default::default() };
    let mut ops_admin = with_token(channel(&ops).await, None);
    assert_eq!(code_of(ops_admin.apply_rules(apply()).await).await, Code::Ok);
    let mut reader = with_token(channel(&dashboards).await, None);
    assert_eq!(code_of(reader.list_breakers(pb::ListBreakersRequest {}).await).await, Code::Ok);
    assert_eq!(code_of(reader.apply_rules(apply()).await).await, Code::PermissionDenied);
    let service_channel = channel(&service).await;
    let mut other = with_token(service_channel.clone(), None);
    assert_eq!(code_of(other.get_rules(pb::GetRulesRequest {}).await).await, Code::Unauthenticated);
    let mut data = pb::floodgate_client::FloodgateClient::new(service_channel);
    assert_eq!(
        data.acquire(acquire("demo", &[("user", "u1")], 1)).await.unwrap().into_inner().verdict(),
        pb::Verdict::Allowed
    );
}
