//! Sign-in throttling for the web consoles: failed sign-ins are counted per client address and
//! per account, and past a limit each further failure locks that key out for a backoff that
//! doubles (capped). A locked key is refused before its credential is even checked (the caller
//! answers 429 with `Retry-After`), so guessing costs time whichever address or account it
//! spreads over; a successful sign-in clears both keys.
//!
//! In memory, bounded ([`MAX_TRACKED`] keys: the stalest are forgotten first), no IO, no clock
//! of its own (every call takes `now`, so the rules are tested without sleeping).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What a failure is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ThrottleKey {
    /// The client's address (the TCP peer; behind a proxy, the proxy's).
    Client(IpAddr),
    /// The account signed in to: a user name, or a digest naming a presented credential.
    /// Never the secret itself.
    Account(String),
}

impl std::fmt::Display for ThrottleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Client(ip) => write!(f, "client {ip}"),
            Self::Account(name) => write!(f, "account {}", name.escape_debug()),
        }
    }
}

/// The limits of one throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleLimits {
    /// Failures of one client address within [`ThrottleLimits::window`] before it is locked.
    pub per_client: u32,
    /// Failures of one account within the window before it is locked.
    pub per_account: u32,
    /// How long a failure is remembered (a key without a failure for this long starts over).
    pub window: Duration,
    /// The first lockout; each further failure doubles it.
    pub first_lockout: Duration,
    /// The longest lockout.
    pub max_lockout: Duration,
}

impl Default for ThrottleLimits {
    /// 10 failures per address, 5 per account, remembered 15 minutes; lockouts from 2 s,
    /// doubling, at most 15 minutes.
    fn default() -> Self {
        Self {
            per_client: 10,
            per_account: 5,
            window: Duration::from_secs(15 * 60),
            first_lockout: Duration::from_secs(2),
            max_lockout: Duration::from_secs(15 * 60),
        }
    }
}

/// The most keys tracked at once.
pub const MAX_TRACKED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// A key that a failure has just locked out (for the caller's log or audit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockout {
    /// The key.
    pub key: ThrottleKey,
    /// Its failures within the window.
    pub failures: u32,
    /// How long it is locked.
    pub duration: Duration,
}

/// Failed sign-ins per client address and per account.
#[derive(Debug, Default)]
pub struct LoginThrottle {
    limits: ThrottleLimits,
    records: Mutex<HashMap<ThrottleKey, Record>>,
}

impl LoginThrottle {
    /// A throttle with `limits`.
    #[must_use]
    pub fn new(limits: ThrottleLimits) -> Self {
        Self {
            limits,
            records: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ThrottleKey, Record>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `Err(retry_after)` while any of `keys` is locked at `now` (the longest wait of them).
    ///
    /// # Errors
    /// How long until a sign-in from these keys is considered again.
    pub fn check(&self, keys: &[ThrottleKey], now: Instant) -> Result<(), Duration> {
        let records = self.lock();
        let wait = keys
            .iter()
            .filter_map(|k| records.get(k)?.locked_until)
            .filter_map(|until| until.checked_duration_since(now))
            .filter(|d| !d.is_zero())
            .max();
        wait.map_or(Ok(()), Err)
    }

    /// Records a failed sign-in against every key; returns the keys it locked out.
    pub fn fail(&self, keys: &[ThrottleKey], now: Instant) -> Vec<Lockout> {
        let mut records = self.lock();
        if records.len() + keys.len() > MAX_TRACKED {
            let window = self.limits.window;
            records.retain(|_, r| {
                now.saturating_duration_since(r.last) < window
                    || r.locked_until.is_some_and(|u| u > now)
            });
            while records.len() + keys.len() > MAX_TRACKED {
                let Some(stalest) = records
                    .iter()
                    .min_by_key(|(_, r)| r.last)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                records.remove(&stalest);
            }
        }
        let mut locked = Vec::new();
        for key in keys {
            let limit = match key {
                ThrottleKey::Client(_) => self.limits.per_client,
                ThrottleKey::Account(_) => self.limits.per_account,
            };
            let record = records.entry(key.clone()).or_insert(Record {
                failures: 0,
                last: now,
                locked_until: None,
            });
            if now.saturating_duration_since(record.last) >= self.limits.window {
                *record = Record {
                    failures: 0,
                    last: now,
                    locked_until: None,
                };
            }
            record.failures = record.failures.saturating_add(1);
            record.last = now;
            if record.failures >= limit {
                let doublings = (record.failures - limit).min(30);
                let duration = self
                    .limits
                    .first_lockout
                    .saturating_mul(1_u32 << doublings)
                    .min(self.limits.max_lockout);
                record.locked_until = Some(now + duration);
                locked.push(Lockout {
                    key: key.clone(),
                    failures: record.failures,
                    duration,
                });
            }
        }
        locked
    }

    /// A successful sign-in: `keys` start over.
    pub fn succeed(&self, keys: &[ThrottleKey]) {
        let mut records = self.lock();
        for key in keys {
            records.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ThrottleLimits {
        ThrottleLimits {
            per_client: 4,
            per_account: 2,
            window: Duration::from_secs(60),
            first_lockout: Duration::from_secs(1),
            max_lockout: Duration::from_secs(8),
        }
    }

    fn client(n: u8) -> ThrottleKey {
        ThrottleKey::Client(IpAddr::from([10, 0, 0, n]))
    }

    fn account(name: &str) -> ThrottleKey {
        ThrottleKey::Account(name.to_owned())
    }

    #[test]
    fn an_account_is_locked_with_a_doubling_backoff() {
        let t = LoginThrottle::new(limits());
        let t0 = Instant::now();
        let keys = [client(1), account("emad")];
        assert_eq!(t.check(&keys, t0), Ok(()));
        assert!(t.fail(&keys, t0).is_empty());
        assert_eq!(t.check(&keys, t0), Ok(()));
        let locked = t.fail(&keys, t0);
        assert_eq!(
            locked,
            vec![Lockout {
                key: account("emad"),
                failures: 2,
                duration: Duration::from_secs(1)
            }]
        );
        assert_eq!(t.check(&keys, t0), Err(Duration::from_secs(1)));
        // The same account from another address is locked too; another account is not.
        assert_eq!(
            t.check(&[client(2), account("emad")], t0),
            Err(Duration::from_secs(1))
        );
        assert_eq!(t.check(&[client(2), account("vera")], t0), Ok(()));
        // After the lockout, each failure doubles it, up to the cap.
        let mut now = t0 + Duration::from_secs(1);
        let mut seen = Vec::new();
        for _ in 0..5 {
            assert_eq!(t.check(&[account("emad")], now), Ok(()));
            let locked = t.fail(&[account("emad")], now);
            seen.push(locked[0].duration.as_secs());
            now += locked[0].duration;
        }
        assert_eq!(seen, [2, 4, 8, 8, 8]);
    }

    #[test]
    fn an_address_is_locked_across_accounts_and_a_success_clears_both() {
        let t = LoginThrottle::new(limits());
        let now = Instant::now();
        for name in ["a", "b", "c"] {
            assert!(t.fail(&[client(1), account(name)], now).is_empty());
        }
        let locked = t.fail(&[client(1), account("d")], now);
        assert_eq!(locked[0].key, client(1));
        assert_eq!(
            t.check(&[client(1), account("e")], now),
            Err(Duration::from_secs(1))
        );
        assert_eq!(t.check(&[client(2), account("e")], now), Ok(()));

        let later = now + Duration::from_secs(1);
        let t = LoginThrottle::new(limits());
        t.fail(&[client(1), account("emad")], now);
        t.succeed(&[client(1), account("emad")]);
        assert!(
            t.fail(&[client(1), account("emad")], later).is_empty(),
            "a success starts the count over"
        );
    }

    #[test]
    fn failures_are_forgotten_after_the_window_and_the_table_is_bounded() {
        let t = LoginThrottle::new(limits());
        let now = Instant::now();
        t.fail(&[account("emad")], now);
        let later = now + Duration::from_secs(61);
        assert!(
            t.fail(&[account("emad")], later).is_empty(),
            "the first failure is older than the window"
        );
        let t = LoginThrottle::new(limits());
        for i in 0..MAX_TRACKED + 10 {
            t.fail(&[account(&format!("user-{i}"))], now);
        }
        assert!(t.lock().len() <= MAX_TRACKED);
    }

    #[test]
    fn keys_never_print_more_than_their_name() {
        assert_eq!(client(1).to_string(), "client 10.0.0.1");
        assert_eq!(account("a\nb").to_string(), "account a\\nb");
    }
}
