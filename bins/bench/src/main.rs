//! `phrony-bench`: parse the options, run the benchmark, print (and write) the report.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let options = phrony_bench::Options::parse();
    match phrony_bench::run(&options) {
        Ok(report) => {
            if report.lost_or_duplicated == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "phrony-bench: {} tool calls lost or duplicated",
                    report.lost_or_duplicated
                );
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("phrony-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
