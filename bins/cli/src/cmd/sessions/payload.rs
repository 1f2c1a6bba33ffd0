//! `phrony sessions payload ID [SEQ]`: one payload of a session whole (its compact JSON text),
//! such as one that `sessions inspect` shortened.

use std::io::{self, Write as _};

use phrony_client::PayloadRef;

use crate::cmd::{Global, remote};

/// Arguments of `phrony sessions payload`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The session id (`run_…`) whose record holds the payload.
    session_id: String,
    /// An event's seq: prints that event's payload.
    seq: Option<u64>,
    /// A tool call's id: prints its `args`, `result` or `error_message` (`--field`).
    #[arg(long = "call", value_name = "CALL_ID", conflicts_with_all = ["seq", "approval"])]
    call: Option<String>,
    /// An approval's id: prints its `args`, `effective_args`, `policy_runtime`, `reason`,
    /// `comment` or `votes.N.comment` (`--field`).
    #[arg(long = "approval", value_name = "APPROVAL_ID", conflicts_with = "seq")]
    approval: Option<String>,
    /// The field: `payload` for an event (the default), a call's or approval's field, or the
    /// session's `input`, `output`, `error` or `descriptive_metadata`.
    #[arg(long)]
    field: Option<String>,
}

/// The payload `args` names.
fn reference(args: &Args) -> anyhow::Result<PayloadRef> {
    let session_id = super::session_id(&args.session_id)?.to_owned();
    let field = match (&args.field, args.seq) {
        (Some(f), _) if !f.trim().is_empty() => f.trim().to_owned(),
        (_, Some(_)) => "payload".to_owned(),
        _ => anyhow::bail!(
            "say which payload: an event's SEQ, or --field (input, output, error, \
             descriptive_metadata; with --call or --approval, a field of that record)"
        ),
    };
    let non_empty = |v: &Option<String>, what: &str| -> anyhow::Result<Option<String>> {
        match v.as_deref().map(str::trim) {
            Some("") => anyhow::bail!("{what} must not be empty"),
            other => Ok(other.map(str::to_owned)),
        }
    };
    if args.seq == Some(0) {
        anyhow::bail!("SEQ starts at 1");
    }
    Ok(PayloadRef {
        session_id,
        seq: args.seq.unwrap_or(0),
        call_id: non_empty(&args.call, "--call")?,
        approval_id: non_empty(&args.approval, "--approval")?,
        field,
    })
}

/// Prints the payload's JSON text and a newline.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let reference = reference(args)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let text = client
            .session_payload(&reference)
            .await
            .map_err(remote::fails("payload"))?;
        let mut out = io::stdout().lock();
        out.write_all(&text)?;
        out.write_all(b"\n")?;
        out.flush()?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> anyhow::Result<PayloadRef> {
        let cli = Cli::try_parse_from(std::iter::once("payload").chain(argv.iter().copied()))?;
        reference(&cli.args)
    }

    #[test]
    fn a_payload_is_named_by_seq_or_record_and_field() {
        let event = parse(&["run_1", "7"]).unwrap();
        assert_eq!((event.seq, event.field.as_str()), (7, "payload"));
        let call = parse(&["run_1", "--call", "c1", "--field", "result"]).unwrap();
        assert_eq!(call.call_id.as_deref(), Some("c1"));
        assert_eq!((call.seq, call.field.as_str()), (0, "result"));
        let input = parse(&["run_1", "--field", "input"]).unwrap();
        assert_eq!((input.call_id, input.approval_id), (None, None));
        let message = |argv: &[&str]| parse(argv).unwrap_err().to_string();
        assert!(message(&["run_1"]).starts_with("say which payload"));
        assert_eq!(message(&["run_1", "0"]), "SEQ starts at 1");
        assert!(message(&["run_1", "3", "--call", "c1"]).contains("cannot be used with"));
    }
}
