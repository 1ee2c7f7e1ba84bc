//! A permit's id: the first 32 of its 128 bits name the process that issued
//! it (random, chosen at start), the other 96 come from a cryptographic
//! generator. Its own module: the guards issue permits under it, and the
//! replication state (strict slots) names them by it.

/// A permit's id: this process's tag and 96 random bits, never 0, written
/// as 32 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PermitId(std::num::NonZeroU128);

/// This process among the replicas: the first 32 bits of its permits' ids.
static TAG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

impl PermitId {
    /// A fresh id. ThreadRng: ChaCha12, seeded and reseeded from the
    /// operating system.
    pub fn random() -> PermitId {
        let random: u128 = rand::random::<u128>() >> 32;
        let id = (u128::from(PermitId::tag()) << 96) | random;
        PermitId(std::num::NonZeroU128::new(id).expect("the tag is never 0"))
    }

    /// The tag of this process's ids (random, never 0, fixed for its life).
    pub fn tag() -> u32 {
        *TAG.get_or_init(|| {
            loop {
                let t: u32 = rand::random();
                if t != 0 {
                    break t;
                }
            }
        })
    }

    /// The tag of the process that issued the id `raw`.
    pub fn issuer(raw: u128) -> u32 {
        (raw >> 96) as u32
    }

    pub(crate) fn from_raw(raw: u128) -> Option<PermitId> {
        std::num::NonZeroU128::new(raw).map(PermitId)
    }

    pub fn get(self) -> u128 {
        self.0.get()
    }
}

impl std::fmt::Display for PermitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0.get())
    }
}
