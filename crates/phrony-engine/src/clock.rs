//! Wall-clock time for the engine: limits, approval expiry and policy `now` read it; timers sleep
//! on it. [`SystemClock`] in production, [`ManualClock`] in tests.

use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio::sync::watch;

/// The engine's source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// Resolves once [`Clock::now`] is at or after `deadline`.
    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'static, ()>;
}

/// The system clock; sleeps with Tokio timers and re-checks on wake-up (so a clock step never
/// fires a timer early).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            loop {
                let left = deadline - Utc::now();
                let Ok(left) = left.to_std() else { return };
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left).await;
            }
        })
    }
}

/// A clock that only moves when told to: deterministic tests advance it past limits and
/// approval expiries, and every pending [`Clock::sleep_until`] whose deadline passed wakes up.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
    tick: watch::Sender<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    #[must_use]
    pub fn new(start: DateTime<Utc>) -> Self {
        let (tick, _) = watch::channel(start);
        Self {
            now: Mutex::new(start),
            tick,
        }
    }

    /// A clock standing at the current system time.
    #[must_use]
    pub fn starting_now() -> Self {
        Self::new(Utc::now())
    }

    /// Moves the clock forward by `by` and wakes the sleepers whose deadline passed.
    pub fn advance(&self, by: std::time::Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        let now = {
            let mut now = self
                .now
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *now = now
                .checked_add_signed(by)
                .unwrap_or(DateTime::<Utc>::MAX_UTC);
            *now
        };
        self.tick.send_replace(now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self
            .now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'static, ()> {
        let mut rx = self.tick.subscribe();
        Box::pin(async move {
            loop {
                if *rx.borrow_and_update() >= deadline {
                    return;
                }
                if rx.changed().await.is_err() {
                    // The clock is gone: nothing will ever move it again.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_only_when_their_deadline_passes() {
        let clock = ManualClock::starting_now();
        let deadline = clock.now() + chrono::Duration::seconds(60);
        let sleeper = tokio::spawn(clock.sleep_until(deadline));
        clock.advance(Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(30));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn system_clock_returns_at_once_for_past_deadlines() {
        let clock = SystemClock;
        let past = clock.now() - chrono::Duration::seconds(1);
        tokio::time::timeout(Duration::from_secs(1), clock.sleep_until(past))
            .await
            .unwrap();
    }
}
