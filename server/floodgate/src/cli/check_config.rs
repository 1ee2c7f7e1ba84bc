//! `floodgate check-config [FILE] [--envoy-config DIR] [--sentinel-rules DIR]`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::rules::envoy::EnvoyConfig;

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("what").required(true).multiple(true).args(["file", "envoy_config", "sentinel_rules"]))]
pub struct CheckConfigArgs {
    /// The rules file to validate.
    file: Option<PathBuf>,
    /// An envoyproxy/ratelimit configuration directory to validate.
    #[arg(long)]
    envoy_config: Option<PathBuf>,
    /// Files of one domain add up (upstream's MERGE_DOMAIN_CONFIG), as
    /// `serve --envoy-merge-domains` reads them.
    #[arg(long, requires = "envoy_config")]
    envoy_merge_domains: bool,
    /// A directory of Sentinel's rules to validate.
    #[arg(long)]
    sentinel_rules: Option<PathBuf>,
}

/// Validates each configuration given; every error is listed, naming the
/// file (and for Envoy's format, the domain and the descriptor path).
pub fn run(args: CheckConfigArgs) -> ExitCode {
    let mut ok = true;
    if let Some(file) = &args.file {
        match crate::server::load_rules(file) {
            Ok((rules, _)) => {
                let n = rules.rules().len();
                let limits: usize = rules.rules().iter().map(|r| r.limits.len()).sum();
                outln!("{}: OK ({n} resources, {limits} limits)", file.display());
            }
            Err(errors) => {
                eprintln!("{errors}");
                ok = false;
            }
        }
    }
    if let Some(dir) = &args.envoy_config {
        let options = crate::rules::envoy::EnvoyOptions { merge_domains: args.envoy_merge_domains };
        match EnvoyConfig::load_dir(dir, &options) {
            Ok((config, _)) => {
                let mut domains: Vec<&str> = config.domains().collect();
                domains.sort_unstable();
                let limits = config.rules().len();
                outln!("{}: OK ({} domains: {}; {limits} limits)", dir.display(), domains.len(), domains.join(", "));
            }
            Err(errors) => {
                eprintln!("{errors}");
                ok = false;
            }
        }
    }
    if let Some(dir) = &args.sentinel_rules {
        let options = crate::rules::sentinel::SentinelOptions::default();
        match crate::rules::sentinel::SentinelRules::load_dir(dir, &options) {
            Ok((rules, _)) => {
                let read: Vec<String> = rules.counts.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
                let limits: usize = rules.rules.iter().map(|r| r.limits.len()).sum();
                let breakers = rules.rules.iter().filter(|r| r.breaker.is_some()).count();
                outln!(
                    "{}: OK ({} rules: {}; {} resources, {limits} limits, {breakers} breakers; {} not enforced)",
                    dir.display(),
                    rules.counts.values().sum::<usize>(),
                    read.join(", "),
                    rules.rules.len(),
                    rules.ignored.len(),
                );
                for why in &rules.ignored {
                    outln!("  not enforced: {why}");
                }
            }
            Err(errors) => {
                eprintln!("{errors}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
