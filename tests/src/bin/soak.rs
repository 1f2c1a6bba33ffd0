//! `soak`: the crash-soak harness (see `tests::soak`), and its journaling worker (`soak worker`).
//!
//! ```text
//! soak [--backend sqlite|postgres] [--trials N] [--seed S] [--report FILE]
//!      [--sessions N] [--faults N] [--no-worker-faults] [--db-faults] [--only FAULT]
//!      [--tolerate-final-turn-rerun] [--tolerate-late-result-race]
//! soak worker --addr HOST:PORT --journal FILE [--work-ms MS] [--duplicate]
//! ```
//!
//! Exit code 0 when every invariant held, 1 when one broke, 2 for a bad command line.

use std::process::ExitCode;
use std::time::Duration;

use tests::soak::{self, Options, worker::WorkerArgs};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return match worker_args(&args[1..]) {
            Ok(w) => {
                soak::worker::run(&w);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("soak worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    match Options::parse(&args) {
        Ok(options) => {
            if soak::run(&options) {
                ExitCode::SUCCESS
            } else {
                eprintln!("soak: an invariant broke (see the violations above)");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(2)
        }
    }
}

fn worker_args(args: &[String]) -> Result<WorkerArgs, String> {
    let mut w = WorkerArgs {
        addr: String::new(),
        journal: std::path::PathBuf::new(),
        work: Duration::from_millis(150),
        duplicate: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--addr" => w.addr = value()?,
            "--journal" => w.journal = value()?.into(),
            "--work-ms" => {
                let v = value()?;
                w.work = Duration::from_millis(
                    v.parse()
                        .map_err(|_| format!("--work-ms: not a number: {v:?}"))?,
                );
            }
            "--duplicate" => w.duplicate = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if w.addr.is_empty() || w.journal.as_os_str().is_empty() {
        return Err("--addr and --journal are required".into());
    }
    Ok(w)
}
