//! A call admitted with a permit and not yet finished: reports its outcome
//! once, and when dropped before that (an outer timeout, a client hanging up,
//! a panic), reports it as a failure, so that no permit is left to expire.

use std::time::Instant;

use crate::client::Client;
use crate::decision::{Outcome, Permit};

pub(crate) struct InFlight {
    client: Client,
    permit: Option<Permit>,
    start: Instant,
}

impl InFlight {
    pub(crate) fn new(client: &Client, permit: Permit) -> Self {
        InFlight { client: client.clone(), permit: Some(permit), start: Instant::now() }
    }

    pub(crate) fn finish(mut self, outcome: Outcome) {
        if let Some(p) = self.permit.take() {
            self.client.report(&p, outcome, Some(self.start.elapsed()));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.client.report(&p, Outcome::Failure, Some(self.start.elapsed()));
        }
    }
}
