//! Noticing that Redis lost data, or went back in time, when no call would.
//!
//! Every script that decides or syncs checks the resource's marker first
//! (see lua/limits.lua), so a bucket in use finds a loss on its next call.
//! A bucket nobody uses finds nothing, and the next call may come through
//! another replica that knows nothing of it: it would start from a full
//! bucket. So each replica checks, once a second, the markers of resources
//! no script of its own has touched for a second, and restores any that
//! changed. When the heartbeat sees that Redis is another process than
//! before (it restarted, or a replica was promoted), every resource known
//! before is checked in the rounds that follow, a batch a round, rather
//! than a batch a second.

use std::time::Duration;

use redis::Value;

use super::Limits;
use super::scripts::{ScriptName, marker_key};
use super::wire::{ReplyError, error};
use floodgate_core::time::Timestamp;
use floodgate_engine::Installed;

/// How many resources one round checks, at most. One small script each: a
/// replica that knows many resources checks them over several rounds rather
/// than holding up its syncs or flooding Redis.
const CHECKS_PER_ROUND: usize = 1000;

/// A resource not touched for this long is checked.
const IDLE: Duration = Duration::from_secs(1);

/// What a round of checks found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Checked {
    /// Every marker asked for was checked.
    All,
    /// Some are left for the next round.
    More,
    /// Redis did not answer.
    Failed,
}

impl Limits<'_> {
    /// Checks the markers no script has found since `since` (or for a
    /// second, without it), and restores those Redis lost or took back in
    /// time. At most `CHECKS_PER_ROUND` of them.
    pub(super) async fn check_markers(&self, rules: &Installed, since: Option<Timestamp>) -> Checked {
        let now = self.engine.clock().now();
        let before = since.unwrap_or_else(|| {
            Timestamp::from_nanos(now.as_nanos().saturating_sub(floodgate_core::time::duration_nanos(IDLE)))
        });
        let batch = self.sync().markers_to_check(before, CHECKS_PER_ROUND);
        let full = batch.len() == CHECKS_PER_ROUND;
        for (resource, token) in batch {
            let mut invocation = self.scripts.get(ScriptName::Marker).prepare_invoke();
            invocation.key(marker_key(&resource)).arg(&token);
            let Some(same) = self.run(ScriptName::Marker, invocation, parse_marker).await else {
                return Checked::Failed;
            };
            if same {
                self.sync().mark(&resource, self.engine.clock().now());
            } else if !self.restore(rules, &resource, &token).await {
                return Checked::Failed;
            }
        }
        if full { Checked::More } else { Checked::All }
    }
}

/// marker.lua: 1 when the marker is the one the replica knows, else 0.
fn parse_marker(v: Value) -> Result<bool, ReplyError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(error(ScriptName::Marker, format!("not 0 or 1: {other:?}"))),
    }
}
