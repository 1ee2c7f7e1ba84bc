//! Long values, kept short: a descriptor value Envoy sends may be any length
//! (a path, a header), and where it becomes part of a bucket key or a stat
//! key it is kept as its digest beyond a bound.

/// The longest value kept as it is.
pub const MAX_PLAIN: usize = 256;

/// What every digest starts with.
const PREFIX: &str = "#sha256:";

/// Whether `value` is kept as its digest: when longer than [`MAX_PLAIN`], or
/// when it starts like a digest, whatever follows (`#sha256:`, or
/// `#sha256_` as a digest reads in a stat label once sanitised): a short
/// value can never name a long value's counter or series.
pub fn needed(value: &str) -> bool {
    value.len() > MAX_PLAIN || value.starts_with(&PREFIX[..7])
}

/// A long value's stand-in: `#sha256:` and the first 128 bits of its
/// SHA-256. The same on every replica (keys meet in Redis), and nobody can
/// choose a value to share another's counter.
pub fn digest(value: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let hex: String = d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{hex}")
}

/// `value` as it is, or its digest when [`needed`].
pub fn bounded(value: &str) -> std::borrow::Cow<'_, str> {
    if needed(value) { std::borrow::Cow::Owned(digest(value)) } else { std::borrow::Cow::Borrowed(value) }
}
