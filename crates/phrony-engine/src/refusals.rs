//! How many `worker.descriptor_refused` events refused registrations may write: a bound on
//! what a process that can reach the `Work` endpoint (in `local` mode, any local process) can
//! add to the audit log by registering again and again with a hash that matches no pin.
//!
//! Every refusal is still refused; only its *event* may be folded into a later one:
//!
//! - **Per registration** ([`RefusalKey`]: the verified credential, the tool, its version and
//!   the received hash — not the worker id, which a process chooses freely): one event per
//!   [`KEY_WINDOW`]. Identical refusals inside the window are counted, and the next event for
//!   the key carries that count as `repeated`. A misconfigured worker that reconnects every
//!   second writes one event a minute, not sixty.
//! - **Over all registrations**: at most [`EVENTS_PER_WINDOW`] events per [`BUDGET_WINDOW`],
//!   so varying the hash or the tool does not get around the bound. Refusals past the budget
//!   are counted, and the next event written (for any key) carries that count as
//!   `unrecorded_refusals`.
//!
//! A count is never dropped: it is either in an event or still held here (then also in the
//! daemon's log, one warning per suppressed refusal). What is held here when the daemon
//! stops is lost with it, which is the price of the bound; the property test
//! `every_refusal_is_an_event_or_counted_in_one` checks the accounting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One event per key at most this often.
pub const KEY_WINDOW: Duration = Duration::from_secs(60);

/// The window of the overall budget.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(60);

/// At most this many refusal events per [`BUDGET_WINDOW`], over all keys.
pub const EVENTS_PER_WINDOW: u32 = 20;

/// Keys remembered at most; the oldest are forgotten first (their counts move to the
/// `unrecorded_refusals` of the next event).
const MAX_KEYS: usize = 1024;

/// What makes two refusals "the same registration".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RefusalKey {
    pub(crate) credential: Option<String>,
    pub(crate) tool: String,
    pub(crate) version: String,
    pub(crate) received: String,
}

/// Whether a refusal gets its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Write the event, carrying these counts.
    Record {
        /// Identical refusals since this key's previous event.
        repeated: u64,
        /// Refusals of any key suppressed by the budget (or forgotten keys) since the last
        /// event that carried such a count.
        unrecorded: u64,
    },
    /// Counted; no event.
    Suppress,
}

#[derive(Debug)]
struct KeyState {
    last_recorded: Instant,
    repeated: u64,
}

/// The bound (see the module docs). Pure: the caller passes the time.
#[derive(Debug, Default)]
pub(crate) struct RefusalLimiter {
    keys: HashMap<RefusalKey, KeyState>,
    budget_start: Option<Instant>,
    budget_used: u32,
    unrecorded: u64,
}

impl RefusalLimiter {
    /// Decides whether the refusal `key` at `now` gets an event.
    pub(crate) fn admit(&mut self, key: &RefusalKey, now: Instant) -> Admission {
        if self
            .budget_start
            .is_none_or(|start| now.saturating_duration_since(start) >= BUDGET_WINDOW)
        {
            self.budget_start = Some(now);
            self.budget_used = 0;
        }
        if let Some(state) = self.keys.get_mut(key)
            && now.saturating_duration_since(state.last_recorded) < KEY_WINDOW
        {
            state.repeated += 1;
            return Admission::Suppress;
        }
        if self.budget_used >= EVENTS_PER_WINDOW {
            self.unrecorded += 1;
            return Admission::Suppress;
        }
        self.budget_used += 1;
        let repeated = self.keys.remove(key).map_or(0, |s| s.repeated);
        self.make_room(now);
        self.keys.insert(
            key.clone(),
            KeyState {
                last_recorded: now,
                repeated: 0,
            },
        );
        Admission::Record {
            repeated,
            unrecorded: std::mem::take(&mut self.unrecorded),
        }
    }

    /// The event admitted for `key` could not be written: its counts and the refusal itself
    /// go back to the unrecorded count, and the key may write again at once.
    pub(crate) fn not_written(&mut self, key: &RefusalKey, admitted: Admission) {
        if let Some(state) = self.keys.remove(key) {
            self.unrecorded += state.repeated;
        }
        self.budget_used = self.budget_used.saturating_sub(1);
        if let Admission::Record {
            repeated,
            unrecorded,
        } = admitted
        {
            self.unrecorded += repeated + unrecorded + 1;
        }
    }

    /// Forgets keys whose window is over and nothing is pending, then, when still full, the
    /// oldest ones (their pending counts move to the unrecorded count).
    fn make_room(&mut self, now: Instant) {
        if self.keys.len() < MAX_KEYS {
            return;
        }
        self.keys.retain(|_, s| {
            s.repeated > 0 || now.saturating_duration_since(s.last_recorded) < KEY_WINDOW
        });
        while self.keys.len() >= MAX_KEYS {
            let Some(oldest) = self
                .keys
                .iter()
                .min_by_key(|(_, s)| s.last_recorded)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(state) = self.keys.remove(&oldest) {
                self.unrecorded += state.repeated;
            }
        }
    }

    /// Refusals counted but not yet carried by an event.
    #[cfg(test)]
    fn pending(&self) -> u64 {
        self.unrecorded + self.keys.values().map(|s| s.repeated).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(hash: &str) -> RefusalKey {
        RefusalKey {
            credential: None,
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            received: hash.into(),
        }
    }

    fn record(repeated: u64, unrecorded: u64) -> Admission {
        Admission::Record {
            repeated,
            unrecorded,
        }
    }

    #[test]
    fn a_reconnecting_worker_writes_one_event_per_window_with_the_count_of_the_others() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        assert_eq!(limiter.admit(&key("h"), t0), record(0, 0));
        for s in 1..60 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(limiter.admit(&key("h"), at), Admission::Suppress, "at {s}s");
        }
        assert_eq!(limiter.admit(&key("h"), t0 + KEY_WINDOW), record(59, 0));
        assert_eq!(limiter.pending(), 0);
    }

    #[test]
    fn another_credential_tool_or_hash_is_another_registration() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        let mut other_credential = key("h");
        other_credential.credential = Some("\"refund-bot\" (token)".into());
        let mut other_tool = key("h");
        other_tool.tool = "orders.lookup".into();
        for k in [key("h"), key("h2"), other_credential, other_tool] {
            assert_eq!(limiter.admit(&k, t0), record(0, 0), "{k:?}");
        }
    }

    #[test]
    fn the_budget_bounds_events_over_all_keys_and_the_next_event_carries_the_rest() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        for i in 0..EVENTS_PER_WINDOW {
            assert_eq!(limiter.admit(&key(&format!("h{i}")), t0), record(0, 0));
        }
        for i in 0..7 {
            let k = key(&format!("flood{i}"));
            assert_eq!(limiter.admit(&k, t0), Admission::Suppress);
        }
        let later = t0 + BUDGET_WINDOW;
        assert_eq!(limiter.admit(&key("next"), later), record(0, 7));
        assert_eq!(limiter.admit(&key("after"), later), record(0, 0));
    }

    #[test]
    fn a_failed_write_gives_its_counts_back_and_lets_the_key_try_again() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        let first = limiter.admit(&key("h"), t0);
        assert_eq!(first, record(0, 0));
        assert_eq!(limiter.admit(&key("h"), t0), Admission::Suppress);
        limiter.not_written(&key("h"), first);
        // The failed refusal itself and the suppressed one after it are carried by the next
        // event, which the key may write at once.
        assert_eq!(limiter.admit(&key("h"), t0), record(0, 2));
    }

    #[test]
    fn a_full_table_forgets_its_oldest_keys_without_losing_their_counts() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        // Spread the keys over budget windows so each gets its event.
        let mut at = t0;
        for i in 0..MAX_KEYS {
            if i % EVENTS_PER_WINDOW as usize == 0 {
                at += BUDGET_WINDOW;
            }
            assert!(matches!(
                limiter.admit(&key(&format!("k{i}")), at),
                Admission::Record { .. }
            ));
            // A repeat right away: pending on the key.
            assert_eq!(
                limiter.admit(&key(&format!("k{i}")), at),
                Admission::Suppress
            );
        }
        assert_eq!(limiter.pending(), MAX_KEYS as u64);
        let Admission::Record { unrecorded, .. } =
            limiter.admit(&key("newcomer"), at + BUDGET_WINDOW)
        else {
            panic!("the newcomer was suppressed");
        };
        assert!(unrecorded >= 1, "the forgotten key's repeat is carried");
        assert!(limiter.keys.len() <= MAX_KEYS);
        assert_eq!(limiter.pending() + unrecorded, MAX_KEYS as u64);
    }

    proptest! {
        /// Every refusal is either an event, or counted in a later event's `repeated` or
        /// `unrecorded`, or still pending here.
        #[test]
        fn every_refusal_is_an_event_or_counted_in_one(
            steps in prop::collection::vec((0u8..40, 0u64..5_000, any::<bool>()), 1..400)
        ) {
            let mut limiter = RefusalLimiter::default();
            let t0 = Instant::now();
            let mut at = t0;
            let (mut refusals, mut accounted) = (0u64, 0u64);
            for (k, advance_ms, fail) in steps {
                at += Duration::from_millis(advance_ms);
                let k = key(&format!("h{k}"));
                refusals += 1;
                match limiter.admit(&k, at) {
                    Admission::Suppress => {}
                    admitted @ Admission::Record { repeated, unrecorded } => {
                        if fail {
                            limiter.not_written(&k, admitted);
                        } else {
                            accounted += 1 + repeated + unrecorded;
                        }
                    }
                }
            }
            prop_assert_eq!(accounted + limiter.pending(), refusals);
        }
    }
}
