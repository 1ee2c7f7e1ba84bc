//! Bucket keys: which limit, and which of its buckets.

use compact_str::CompactString;

/// A limit's identity in the bucket store: given by the engine when rules
/// are installed, and stable across installs while the limit keeps its
/// rule, name and algorithm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitId(pub u32);

/// One bucket: a limit and its scope (the resource for per-resource rules, then
/// the values of the limit's key descriptors). Scopes up to 24 bytes are stored
/// inline, so most keys cost no allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    pub limit: LimitId,
    pub scope: CompactString,
}

const SEP: char = '\u{1f}';
const ESC: char = '\u{1e}';

// A part longer than `digest::MAX_PLAIN` (a descriptor value Envoy sends: a
// path, a header) is kept as its digest (see `crate::digest`), so that a key
// stays small whatever the value, and values still count apart.
use crate::digest::{digest, needed};

impl BucketKey {
    pub fn global(limit: LimitId) -> Self {
        BucketKey { limit, scope: CompactString::const_new("") }
    }

    /// The key for these parts, joined unambiguously: a separator or escape
    /// character inside a part is escaped, so different parts never share a key.
    pub fn new<'a>(limit: LimitId, parts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut scope = CompactString::const_new("");
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                scope.push(SEP);
            }
            if needed(part) {
                scope.push_str(&digest(part));
            } else if part.contains([SEP, ESC]) {
                for c in part.chars() {
                    if c == SEP || c == ESC {
                        scope.push(ESC);
                    }
                    scope.push(c);
                }
            } else {
                scope.push_str(part);
            }
        }
        BucketKey { limit, scope }
    }

    /// The key of a scope the store held (already joined and escaped).
    pub(super) fn from_scope(limit: LimitId, scope: &str) -> Self {
        BucketKey { limit, scope: CompactString::new(scope) }
    }

    /// The parts this key was built from (a long part as its digest).
    pub fn parts(&self) -> Vec<String> {
        let mut parts = vec![String::new()];
        let mut escaped = false;
        for c in self.scope.chars() {
            match c {
                _ if escaped => {
                    parts.last_mut().unwrap().push(c);
                    escaped = false;
                }
                ESC => escaped = true,
                SEP => parts.push(String::new()),
                _ => parts.last_mut().unwrap().push(c),
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_never_collide() {
        let id = LimitId(1);
        let a = BucketKey::new(id, ["a\u{1f}b", "c"]);
        let b = BucketKey::new(id, ["a", "b\u{1f}c"]);
        assert_ne!(a, b);
        assert_eq!(a.parts(), ["a\u{1f}b", "c"]);
        assert_eq!(b.parts(), ["a", "b\u{1f}c"]);
        let c = BucketKey::new(id, ["x\u{1e}", "y"]);
        assert_eq!(c.parts(), ["x\u{1e}", "y"]);
    }

    #[test]
    fn long_parts_are_kept_as_their_digest_and_still_count_apart() {
        let id = LimitId(2);
        let long = |c: char| c.to_string().repeat(crate::digest::MAX_PLAIN + 1);
        let a = BucketKey::new(id, ["edge", &long('a')]);
        let b = BucketKey::new(id, ["edge", &long('b')]);
        assert_ne!(a, b);
        assert_eq!(a, BucketKey::new(id, ["edge", &long('a')]), "the same value, the same key");
        assert_eq!(a.parts()[1], digest(&long('a')));
        assert!(a.parts()[1].starts_with("#sha256:") && a.scope.len() < 64, "{}", a.scope);
        let exact = "x".repeat(crate::digest::MAX_PLAIN);
        assert_eq!(BucketKey::new(id, [exact.as_str()]).parts(), [exact], "up to the bound, as it is");
        let spelled = digest(&long('a'));
        assert_ne!(BucketKey::new(id, ["edge", &spelled]), a, "a value spelled like a digest is not its key");
    }

    #[test]
    fn short_keys_are_inline() {
        let k = BucketKey::new(LimitId(3), ["tenant-42", "user-1234"]);
        assert!(!k.scope.is_heap_allocated());
        assert_eq!(std::mem::size_of::<BucketKey>(), 32);
    }
}
