//! `serve`'s flags for Alibaba Sentinel's rules: the directory its dashboard
//! or data source keeps them in, and the descriptors that carry Sentinel's
//! notions (the caller's origin, the entrance context, hot parameters).

use std::path::PathBuf;

use clap::Args;

use crate::rules::sentinel::SentinelOptions;

#[derive(Args, Debug)]
#[command(next_help_heading = "Sentinel's rules")]
pub(super) struct SentinelArgs {
    /// A directory of Sentinel's rules: JSON files named by their type
    /// (`flow-rules.json`, `{app}-param-rules`, `DegradeRule.json`...), as its
    /// dashboard and file, Nacos, Apollo or ZooKeeper data sources keep them.
    /// Watched; a bad file refuses the change whole. Merged after the rules
    /// file (a resource both name keeps the file's rule); given alone (no
    /// --config), no embedded rules are loaded.
    #[arg(long, env = "FLOODGATE_SENTINEL_RULES")]
    pub sentinel_rules: Option<PathBuf>,
    /// The descriptor holding the entrance context (`strategy: 2`, chain).
    #[arg(long, default_value = "context", requires = "sentinel_rules", value_parser = super::super::descriptor_key)]
    pub sentinel_context_key: String,
    /// Hot parameter `i` is the descriptor `{prefix}{i}`.
    #[arg(long, default_value = "param", requires = "sentinel_rules", value_parser = super::super::descriptor_key)]
    pub sentinel_param_prefix: String,
    /// Sentinel's `csp.sentinel.flow.cold.factor` for warm-up rules.
    #[arg(long, default_value_t = 3, requires = "sentinel_rules", value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub sentinel_cold_factor: u32,
}

impl SentinelArgs {
    /// Sentinel's rules and how they meet requests; `origin_key` is the
    /// descriptor holding the caller's origin (`--origin-key`).
    pub(super) fn sources(self, origin_key: &str) -> Option<(PathBuf, SentinelOptions)> {
        let options = SentinelOptions {
            origin_key: origin_key.to_string(),
            context_key: self.sentinel_context_key,
            param_prefix: self.sentinel_param_prefix,
            cold_factor: self.sentinel_cold_factor,
        };
        self.sentinel_rules.map(|dir| (dir, options))
    }
}
