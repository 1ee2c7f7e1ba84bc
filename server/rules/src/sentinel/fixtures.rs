//! Sentinel rules as its dashboard writes them, for tests here and in the
//! engine crate (which decides with them, step by step as Sentinel's own
//! tests expect).

use super::{SentinelOptions, SentinelRules};
use crate::RuleErrors;

/// Reads `files` (name, text) as one directory of Sentinel rules.
pub fn read(files: &[(&str, &str)]) -> Result<SentinelRules, RuleErrors> {
    let files: Vec<(String, String)> = files.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect();
    SentinelRules::parse(&files, &SentinelOptions::default())
}

// --- reading what the dashboard writes ---

/// A directory as the dashboard's Nacos/Apollo publishers leave it: flat
/// entities with the dashboard's own keys for flow, degrade and system
/// rules; `{"rule": {...}}` wrappers for hot-parameter and authority rules.
pub const FLOW: &str = r#"[
  {"id":1,"app":"shop","ip":"10.0.0.7","port":8719,"gmtCreate":1700000000000,"gmtModified":1700000000000,
   "resource":"GET:/orders","limitApp":"default","grade":1,"count":20.0,"strategy":0,"controlBehavior":0,"clusterMode":false},
  {"id":2,"app":"shop","resource":"GET:/orders","limitApp":"app-a","grade":1,"count":5,"strategy":0,"controlBehavior":0},
  {"id":3,"app":"shop","resource":"GET:/orders","limitApp":"other","grade":1,"count":2},
  {"id":4,"app":"shop","resource":"GET:/orders","limitApp":"default","grade":1,"count":1,"strategy":2,"refResource":"web"},
  {"id":5,"app":"shop","resource":"POST:/pay","grade":1,"count":10,"controlBehavior":1,"warmUpPeriodSec":10},
  {"id":6,"app":"shop","resource":"POST:/pay","grade":0,"count":8},
  {"id":7,"app":"shop","resource":"report","grade":1,"count":10,"controlBehavior":2,"maxQueueingTimeMs":500},
  {"id":8,"app":"shop","resource":"report","grade":1,"count":5,"strategy":1,"refResource":"GET:/orders"},
  {"id":9,"app":"shop","resource":"burst","grade":1,"count":10,"controlBehavior":3,"warmUpPeriodSec":5,"maxQueueingTimeMs":200,
   "clusterMode":true,"clusterConfig":{"flowId":7,"thresholdType":1,"fallbackToLocalWhenFail":true}}
]"#;

pub const DEGRADE: &str = r#"[
  {"id":1,"app":"shop","resource":"POST:/pay","grade":0,"count":50,"timeWindow":5,"minRequestAmount":10,"slowRatioThreshold":0.8,"statIntervalMs":20000,"passCount":0},
  {"id":2,"app":"shop","resource":"POST:/pay","grade":2,"count":5,"timeWindow":5,"minRequestAmount":10,"statIntervalMs":20000}
]"#;

pub const SYSTEM: &str = r#"[
  {"id":1,"app":"shop","highestSystemLoad":-1,"highestCpuUsage":0.8,"qps":-1,"avgRt":-1,"maxThread":-1},
  {"id":2,"app":"shop","highestSystemLoad":-1,"highestCpuUsage":-1,"qps":3000,"avgRt":200,"maxThread":-1}
]"#;

pub const PARAM: &str = r#"[
  {"id":1,"app":"shop","ip":"10.0.0.7","port":8719,"gmtCreate":1610036605973,"gmtModified":1610037560593,
   "rule":{"resource":"/user/info/{id}","grade":1,"paramIdx":0,"count":3.0,"durationInSec":1,"burstCount":0,
           "controlBehavior":0,"maxQueueingTimeMs":0,"limitApp":"default","clusterMode":false,
           "clusterConfig":{"fallbackToLocalWhenFail":true,"sampleCount":10,"thresholdType":0,"windowIntervalMs":1000},
           "paramFlowItemList":[{"object":"vip","count":10,"classType":"java.lang.String"},{"object":"7","count":0,"classType":"int"}]}}
]"#;

pub const AUTHORITY: &str = r#"[
  {"id":1,"app":"shop","rule":{"resource":"GET:/orders","limitApp":"evil,worse","strategy":1}},
  {"id":2,"app":"shop","rule":{"resource":"GET:/orders","limitApp":"app-a","strategy":0}}
]"#;

pub fn dashboard() -> SentinelRules {
    read(&[
        ("shop-flow-rules", FLOW),
        ("shop-degrade-rules.json", DEGRADE),
        ("SystemRule.json", SYSTEM),
        ("shop-param-rules", PARAM),
        ("shop-authority-rules.json", AUTHORITY),
    ])
    .expect("a dashboard export reads")
}
