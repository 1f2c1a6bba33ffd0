//! The output contract of a task (`output.format: json`): what the model is told when its final
//! answer fails the check, the failure message, and the outcome of an escalation. The driver
//! runs the check (`Driver::check_output`); `calls.rs` opens the escalation's approval.

use phrony_ledger::{OutputAction, OutputInvalid};
use serde_json::Value;

use crate::setup::MAX_OUTPUT_ATTEMPTS;

/// What a human decided about an answer that failed the output check.
#[derive(Debug)]
pub(crate) enum OutputDecision {
    /// Accepted: the session completes with the answer.
    Accepted {
        approval_id: uuid::Uuid,
        accepted_by: String,
    },
    /// Rejected: the session fails with this message.
    Rejected { message: String },
}

/// The problems as the model and people read them: one per line.
fn listed(errors: &[String]) -> String {
    errors
        .iter()
        .map(|e| format!("- {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The user message of the next turn for `retry` and `repair`; `None` for the other actions.
pub(crate) fn feedback(
    action: OutputAction,
    errors: &[String],
    schema: Option<&Value>,
) -> Option<String> {
    let schema = schema.map_or_else(String::new, |s| {
        format!("\nThe JSON Schema it must match:\n{s}")
    });
    let problems = listed(errors);
    match action {
        OutputAction::Retry => Some(format!(
            "Your answer is not valid output for this task:\n{problems}\nAnswer again with \
             only one JSON document, no other text.{schema}"
        )),
        OutputAction::Repair => Some(format!(
            "Your previous answer is not valid output for this task:\n{problems}\nRepair it: \
             reply with the corrected JSON document only, changing nothing but what these \
             problems require.{schema}"
        )),
        OutputAction::Escalate | OutputAction::Fail => None,
    }
}

/// Why the session fails for an invalid output: the configured handling, how it ended, and
/// the last answer's problems.
pub(crate) fn failure_message(invalid: &OutputInvalid) -> String {
    let how = match invalid.on_invalid {
        OutputAction::Retry => format!(
            "the output is still invalid after {MAX_OUTPUT_ATTEMPTS} attempts (on_invalid: retry)"
        ),
        OutputAction::Repair => {
            "the output is still invalid after a repair (on_invalid: repair)".to_owned()
        }
        OutputAction::Escalate | OutputAction::Fail => {
            format!("the output is invalid (on_invalid: {})", invalid.on_invalid)
        }
    };
    format!(
        "{how}; the final answer of turn {} does not match output.format json: {}",
        invalid.turn,
        invalid.errors.join("; ")
    )
}

/// Why the session fails when a human rejected the answer.
pub(crate) fn rejected_message(invalid: &OutputInvalid, by: &str, comment: &str) -> String {
    let comment = if comment.trim().is_empty() {
        String::new()
    } else {
        format!(": {comment}")
    };
    format!(
        "the output was rejected by {by}{comment} (on_invalid: escalate); the final answer of \
         turn {} does not match output.format json: {}",
        invalid.turn,
        invalid.errors.join("; ")
    )
}
