//! A criterion measurement that reads the benchmark thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`) instead of the wall clock.
//!
//! On a machine shared with other builds the wall clock also counts the time the benchmark thread
//! waits for a core, so figures drift with the load; the thread's CPU time does not (cache
//! pressure from the neighbours still shows). Set `PHRONY_BENCH_CLOCK=wall` for wall-clock figures.

use std::time::Duration;

use criterion::Criterion;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use rustix::time::{ClockId, clock_gettime};

/// The benchmark thread's CPU time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuTime;

/// Criterion's own wall-clock measurement, used only for its duration formatter.
static WALL: WallTime = WallTime;

fn now() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
    Duration::new(secs, nanos)
}

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        now()
    }

    fn end(&self, start: Duration) -> Duration {
        now().saturating_sub(start)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

/// Runs `bench` on the clock `PHRONY_BENCH_CLOCK` names (`cpu`, the default, or `wall`) and
/// prints criterion's summary.
pub(crate) fn run(bench: fn(&mut Criterion<CpuTime>), wall: fn(&mut Criterion<WallTime>)) {
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark binary, like criterion's own flags, is configured by whoever runs it"
    )]
    let clock = std::env::var("PHRONY_BENCH_CLOCK").unwrap_or_default();
    if clock == "wall" {
        println!("clock: wall time (PHRONY_BENCH_CLOCK=wall)");
        let mut c = Criterion::default().configure_from_args();
        wall(&mut c);
        c.final_summary();
    } else {
        println!("clock: the benchmark thread's CPU time (PHRONY_BENCH_CLOCK=wall for wall time)");
        let mut c = Criterion::default()
            .with_measurement(CpuTime)
            .configure_from_args();
        bench(&mut c);
        c.final_summary();
    }
}
