//! Long values, kept short: a descriptor value Envoy sends may be any length
//! (a path, a header), and where it becomes part of a bucket key or a stat
//! key it is kept as its digest beyond a bound.

/// Where FNV-1a starts (see [`fnv1a`]).
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64 bits, of `bytes`, going on from `hash` ([`FNV_START`] for a
/// new one): the same in every process and run. It tells texts apart and
/// spreads them; it keeps no secret.
pub fn fnv1a(mut hash: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

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
