//! `serve`'s flags for Envoy's rate limit service: where envoyproxy/ratelimit's
//! configuration comes from (a directory, or an xDS control plane), and how
//! `ShouldRateLimit` answers. Each names the upstream setting it stands for.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::decider::{HeaderNames, RlsHeaders, RlsOptions};
use crate::rules::envoy::EnvoyOptions;
use crate::server::EnvoySources;
use crate::xds::{XdsConfig, XdsTls};

/// Envoy's rate limit service with envoyproxy/ratelimit's configuration.
#[derive(Args, Debug)]
#[command(next_help_heading = "Envoy (ShouldRateLimit)")]
pub(super) struct EnvoyArgs {
    /// An envoyproxy/ratelimit configuration: a directory of YAML files, each
    /// a `domain` and its `descriptors`, watched for changes. Its domains are
    /// decided by it; other RLS domains by the rules file. Given alone (no
    /// --config), no Floodgate rules are loaded.
    #[arg(long, env = "FLOODGATE_ENVOY_CONFIG", conflicts_with = "envoy_xds")]
    envoy_config: Option<PathBuf>,
    /// Files (or xDS resources) of one domain add up instead of being refused
    /// (upstream's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "FLOODGATE_ENVOY_MERGE_DOMAINS")]
    envoy_merge_domains: bool,
    /// Answer every ShouldRateLimit OK, still counting what would have been
    /// denied (upstream's SHADOW_MODE).
    #[arg(long, env = "FLOODGATE_ENVOY_SHADOW_MODE")]
    envoy_shadow_mode: bool,
    /// Every descriptor in quota mode: a request is OVER_LIMIT only when all
    /// its descriptors are (upstream's QUOTA_MODE).
    #[arg(long, env = "FLOODGATE_ENVOY_QUOTA_MODE")]
    envoy_quota_mode: bool,
    /// Add rate limit headers to RLS answers, for Envoy to send to the client
    /// (upstream's LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long, value_enum, env = "FLOODGATE_ENVOY_RESPONSE_HEADERS")]
    envoy_response_headers: Option<RlsHeaders>,
    /// The limit header's name (upstream's LIMIT_LIMIT_HEADER).
    #[arg(long, value_name = "NAME", requires = "envoy_response_headers", value_parser = header_name)]
    envoy_limit_header: Option<String>,
    /// The remaining header's name (upstream's LIMIT_REMAINING_HEADER).
    #[arg(long, value_name = "NAME", requires = "envoy_response_headers", value_parser = header_name)]
    envoy_remaining_header: Option<String>,
    /// The reset header's name (upstream's LIMIT_RESET_HEADER).
    #[arg(long, value_name = "NAME", requires = "envoy_response_headers", value_parser = header_name)]
    envoy_reset_header: Option<String>,
    /// Tell Envoy in the answer's dynamic metadata what was asked and the
    /// `metadata` of the descriptors that passed (upstream's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "FLOODGATE_ENVOY_RESPONSE_DYNAMIC_METADATA")]
    envoy_response_dynamic_metadata: bool,
    /// Past this share of a limit, hits count as near_limit in upstream's
    /// stats (upstream's NEAR_LIMIT_RATIO).
    #[arg(long, default_value_t = 0.8, value_parser = ratio)]
    envoy_near_limit_ratio: f32,
    /// The most label sets of upstream's stats whose key names request
    /// values (detailed_metric, value_to_metric, limits Envoy sends); past
    /// it, a domain's new ones add up under key1="_overflow".
    #[arg(long, default_value_t = 10_000, value_parser = super::super::parse_positive)]
    envoy_stats_max_series: usize,
    /// The RLS descriptor entry whose value is the request's priority
    /// (critical_plus, critical, sheddable_plus, sheddable) when its system
    /// sheds load; "" for none. Map it from a header only a trusted hop sets.
    #[arg(long, default_value = "priority", env = "FLOODGATE_ENVOY_PRIORITY_KEY")]
    envoy_priority_key: String,
    #[command(flatten)]
    xds: XdsArgs,
}

/// The configuration from an xDS control plane.
#[derive(Args, Debug)]
#[command(next_help_heading = "Envoy configuration over xDS")]
struct XdsArgs {
    /// Stream the configuration from this xDS control plane (http:// or
    /// https://), as Envoy Gateway serves it: RateLimitConfig resources over
    /// ADS (upstream's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_SERVER_URL).
    #[arg(long, env = "FLOODGATE_ENVOY_XDS")]
    envoy_xds: Option<String>,
    /// The node id the control plane knows this server by (CONFIG_GRPC_XDS_NODE_ID).
    #[arg(long, default_value = "default", requires = "envoy_xds")]
    envoy_xds_node_id: String,
    /// The node's cluster.
    #[arg(long, default_value = "", requires = "envoy_xds")]
    envoy_xds_node_cluster: String,
    /// Node metadata, KEY=VALUE, comma-separated (CONFIG_GRPC_XDS_NODE_METADATA).
    #[arg(long, value_name = "KEY=VALUE", value_delimiter = ',', value_parser = pair, requires = "envoy_xds")]
    envoy_xds_node_metadata: Vec<(String, String)>,
    /// gRPC metadata to send with the stream, KEY=VALUE; repeat for more
    /// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
    #[arg(long, value_name = "KEY=VALUE", value_parser = pair, requires = "envoy_xds")]
    envoy_xds_header: Vec<(String, String)>,
    /// The incremental (delta) protocol instead of the state of the world.
    #[arg(long, requires = "envoy_xds")]
    envoy_xds_delta: bool,
    /// A CA (PEM) to trust for the control plane's certificate
    /// (CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
    #[arg(long, requires = "envoy_xds")]
    envoy_xds_ca: Option<PathBuf>,
    /// A client certificate (PEM) for a control plane that asks for one
    /// (CONFIG_GRPC_XDS_CLIENT_TLS_CERT).
    #[arg(long, requires_all = ["envoy_xds", "envoy_xds_key"])]
    envoy_xds_cert: Option<PathBuf>,
    /// The client certificate's key (PEM) (CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(long, requires_all = ["envoy_xds", "envoy_xds_cert"])]
    envoy_xds_key: Option<PathBuf>,
    /// The name the control plane's certificate must carry, when not the
    /// URL's host (CONFIG_GRPC_XDS_SERVER_TLS_SAN).
    #[arg(long, requires = "envoy_xds")]
    envoy_xds_server_name: Option<String>,
    /// The first wait before reconnecting (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL).
    #[arg(long, default_value = "1s", value_parser = super::super::at_least_100ms)]
    envoy_xds_backoff_initial: Duration,
    /// The longest wait before reconnecting (XDS_CLIENT_BACKOFF_MAX_INTERVAL).
    #[arg(long, default_value = "60s", value_parser = super::super::at_least_100ms)]
    envoy_xds_backoff_max: Duration,
    /// The largest update taken from the control plane, in bytes
    /// (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES).
    #[arg(long, default_value_t = 16 << 20, value_parser = super::super::parse_positive)]
    envoy_xds_max_bytes: usize,
    /// A stream that brings no response this long after it opens is
    /// dropped and opened again (as Envoy's initial_fetch_timeout).
    #[arg(long, default_value = "15s", value_parser = super::super::at_least_100ms)]
    envoy_xds_initial_fetch_timeout: Duration,
    /// Ready before the first configuration arrives; without it, /readyz
    /// waits for it, and ShouldRateLimit for a domain Floodgate's rules do
    /// not have is UNAVAILABLE (Envoy's failure mode decides it) until it
    /// comes (upstream's FORCE_START_WITHOUT_INITIAL_CONFIG).
    #[arg(long, requires = "envoy_xds")]
    envoy_xds_ready_without_config: bool,
}

impl EnvoyArgs {
    /// Where the configuration comes from, and how the RLS answers. Files
    /// named by the flags are read now, before anything starts.
    pub(super) fn sources(self) -> anyhow::Result<(EnvoySources, RlsOptions)> {
        let options = EnvoyOptions { merge_domains: self.envoy_merge_domains };
        let headers = self.envoy_response_headers.map(|style| {
            let names = HeaderNames::from(style);
            // Read once for the life of the process.
            let leak = |name: Option<String>, default| name.map_or(default, |n| &*Box::leak(n.into_boxed_str()));
            HeaderNames {
                limit: leak(self.envoy_limit_header, names.limit),
                remaining: leak(self.envoy_remaining_header, names.remaining),
                reset: leak(self.envoy_reset_header, names.reset),
            }
        });
        let rls = RlsOptions {
            shadow: self.envoy_shadow_mode,
            quota: self.envoy_quota_mode,
            headers,
            priority_key: Box::leak(self.envoy_priority_key.into_boxed_str()),
            dynamic_metadata: self.envoy_response_dynamic_metadata,
            near_ratio: self.envoy_near_limit_ratio,
            stat_series: self.envoy_stats_max_series,
        };
        let ready_without_config = self.xds.envoy_xds_ready_without_config;
        let xds = self.xds.config(options)?;
        Ok((EnvoySources { dir: self.envoy_config, xds, options, ready_without_config }, rls))
    }
}

impl XdsArgs {
    fn config(self, options: EnvoyOptions) -> anyhow::Result<Option<XdsConfig>> {
        let Some(url) = self.envoy_xds else { return Ok(None) };
        if !url.starts_with("http://") && !url.starts_with("https://") {
            anyhow::bail!("--envoy-xds: '{url}' must start with http:// or https://");
        }
        if self.envoy_xds_backoff_initial > self.envoy_xds_backoff_max {
            anyhow::bail!("--envoy-xds-backoff-initial is longer than --envoy-xds-backoff-max");
        }
        let read = |flag: &str, path: &Option<PathBuf>| -> anyhow::Result<Option<Vec<u8>>> {
            path.as_ref()
                .map(|p| {
                    crate::files::read_file(p, 1 << 20).with_context(|| format!("{flag}: reading {}", p.display()))
                })
                .transpose()
        };
        let ca = read("--envoy-xds-ca", &self.envoy_xds_ca)?;
        let cert = read("--envoy-xds-cert", &self.envoy_xds_cert)?;
        let key = read("--envoy-xds-key", &self.envoy_xds_key)?;
        let tls = (ca.is_some() || cert.is_some() || self.envoy_xds_server_name.is_some()).then(|| XdsTls {
            ca,
            identity: cert.zip(key),
            server_name: self.envoy_xds_server_name,
        });
        let headers = self
            .envoy_xds_header
            .into_iter()
            .map(|(k, v)| {
                let key =
                    k.parse().map_err(|_| anyhow::anyhow!("--envoy-xds-header: '{k}' is not a gRPC metadata key"))?;
                let value =
                    v.parse().map_err(|_| anyhow::anyhow!("--envoy-xds-header: the value of '{k}' is not ASCII"))?;
                Ok((key, value))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(XdsConfig {
            url,
            node_id: self.envoy_xds_node_id,
            node_cluster: self.envoy_xds_node_cluster,
            node_metadata: self.envoy_xds_node_metadata,
            headers,
            tls,
            delta: self.envoy_xds_delta,
            backoff: (self.envoy_xds_backoff_initial, self.envoy_xds_backoff_max),
            max_message: self.envoy_xds_max_bytes,
            initial_fetch_timeout: self.envoy_xds_initial_fetch_timeout,
            options,
        }))
    }
}

/// An HTTP header name.
fn header_name(s: &str) -> Result<String, String> {
    http::HeaderName::from_bytes(s.as_bytes()).map(|_| s.to_string()).map_err(|_| format!("'{s}' is not a header name"))
}

/// A share from 0 to 1.
fn ratio(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        Ok(_) => Err("must be from 0 to 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// KEY=VALUE.
fn pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("'{s}' is not KEY=VALUE")),
    }
}
