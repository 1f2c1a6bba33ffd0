//! `phrony sessions cancel ID` and `phrony sessions complete ID`: end a session.

use serde_json::json;

use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony sessions cancel` and `phrony sessions complete`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The session id (`run_…`).
    session_id: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// How to end the session.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    /// `CancelSession`.
    Cancel,
    /// `CompleteSession`.
    Complete,
}

/// Prints `cancelled <id>` or `completed <id>`.
pub(crate) fn run(args: &Args, global: &Global, stop: Stop) -> anyhow::Result<()> {
    let id = super::session_id(&args.session_id)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let actor = remote::actor(client.sends_credential())?;
        let done = match stop {
            Stop::Cancel => {
                client
                    .cancel_session(id, &actor)
                    .await
                    .map_err(remote::change_fails(
                        "cancel",
                        "the cancellation",
                        format!("phrony sessions inspect {id}"),
                    ))?;
                "cancelled"
            }
            Stop::Complete => {
                client
                    .complete_session(id, &actor)
                    .await
                    .map_err(remote::change_fails(
                        "complete",
                        "the completion",
                        format!("phrony sessions inspect {id}"),
                    ))?;
                "completed"
            }
        };
        match args.output {
            Output::Json => render::json(&json!({"session_id": id, "status": done})),
            Output::Text => render::line(format_args!("{done} {id}")),
        }
    })
}
