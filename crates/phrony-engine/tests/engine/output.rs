//! The output contract of a task (`output.format: json`, issue #17): the final answer is parsed
//! and checked against `output.schema`; `on_invalid` retries (3 answers at most), repairs once,
//! escalates to a human or fails, and every check is an `output.invalid` / `output.accepted`
//! event. Text output is unchanged.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use phrony_engine::{Engine, EngineDeps, OUTPUT_TOOL};
use phrony_ledger::{
    ApprovalStatus, EventBody, OutputAccepted, OutputAction, OutputInvalid, SessionStatus,
};
use serde_json::{Value, json};

use crate::common::*;

const VALID: &str = r#"{"refund_id": "rf_2891", "status": "issued"}"#;

/// The `output` section: JSON with the refund schema, and `on_invalid` when given.
fn json_output(on_invalid: Option<&str>) -> AgentOptions {
    let on_invalid = on_invalid.map_or_else(String::new, |o| format!("  on_invalid: {o}\n"));
    AgentOptions {
        output: Some(format!(
            "  format: json\n{on_invalid}  schema:\n    inline:\n      type: object\n      properties:\n        refund_id: {{type: string}}\n        status: {{type: string}}\n      required: [refund_id, status]\n      additionalProperties: false\n"
        )),
        ..AgentOptions::default()
    }
}

async fn output_events(h: &Harness, id: &str) -> (Vec<OutputInvalid>, Vec<OutputAccepted>) {
    let mut invalid = Vec::new();
    let mut accepted = Vec::new();
    for e in h.events(id).await {
        match e.body().unwrap() {
            EventBody::OutputInvalid(i) => {
                assert_eq!(e.actor, "system");
                invalid.push(i);
            }
            EventBody::OutputAccepted(a) => accepted.push(a),
            _ => {}
        }
    }
    (invalid, accepted)
}

fn last_user_text(h: &Harness, request: usize) -> String {
    user_texts(&h.script.requests()[request]).pop().unwrap()
}

#[tokio::test]
async fn a_text_output_completes_as_before() {
    let h = Harness::memory(
        &AgentOptions::default(),
        vec![Step::say("Not JSON at all.")],
    )
    .await;
    let s = h.start("Hello.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    let output = done.output.unwrap();
    assert_eq!(output["message"], "Not JSON at all.");
    assert!(output.get("json").is_none(), "{output}");
    assert!(
        !h.event_types(&s.id)
            .await
            .iter()
            .any(|t| t.starts_with("output.")),
        "no output checks for text output"
    );
    assert_eq!(h.script.requests().len(), 1);
    assert!(h.script.requests()[0].response_schema.is_none());
}

#[tokio::test]
async fn a_valid_json_answer_is_the_sessions_json_output() {
    let h = Harness::memory(
        &json_output(Some("retry")),
        vec![Step::say(&format!("```json\n{VALID}\n```"))],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed);
    let output = done.output.unwrap();
    assert_eq!(
        output["json"],
        json!({"refund_id": "rf_2891", "status": "issued"})
    );
    let (invalid, accepted) = output_events(&h, &s.id).await;
    assert!(invalid.is_empty());
    assert_eq!(accepted.len(), 1);
    assert_eq!((accepted[0].turn, accepted[0].attempt), (1, 1));
    assert!(accepted[0].accepted_by.is_none());
    // Not strict: the schema is not sent as a structured-output format.
    assert!(h.script.requests()[0].response_schema.is_none());
    // Inspect shows the output too.
    let seen = phrony_engine::inspect(
        phrony_engine::store_timeline(&h.store, &s.id)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        seen.session.output.json,
        Some(json!({"refund_id": "rf_2891", "status": "issued"}))
    );
    assert!(
        seen.timeline
            .iter()
            .any(|e| e.summary == "output accepted: valid JSON, check 1"),
        "{:#?}",
        seen.timeline
    );
}

#[tokio::test]
async fn retry_asks_again_with_the_errors_and_succeeds_on_the_second_attempt() {
    let h = Harness::memory(
        &json_output(Some("retry")),
        vec![
            Step::say("The refund rf_2891 was issued."),
            Step::say(VALID),
        ],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    let output = done.output.unwrap();
    assert_eq!(output["json"]["refund_id"], "rf_2891");
    assert_eq!(output["message"], VALID);

    let requests = h.script.requests();
    assert_eq!(requests.len(), 2);
    let feedback = last_user_text(&h, 1);
    assert!(
        feedback.starts_with("Your answer is not valid output"),
        "{feedback}"
    );
    assert!(feedback.contains("not JSON"), "{feedback}");
    assert!(
        feedback.contains("\"required\":[\"refund_id\",\"status\"]"),
        "{feedback}"
    );

    let (invalid, accepted) = output_events(&h, &s.id).await;
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0].turn, 1);
    assert_eq!(invalid[0].attempt, 1);
    assert_eq!(invalid[0].on_invalid, OutputAction::Retry);
    assert_eq!(invalid[0].action, OutputAction::Retry);
    assert_eq!(invalid[0].feedback.as_deref(), Some(feedback.as_str()));
    assert_eq!(accepted.len(), 1);
    assert_eq!((accepted[0].turn, accepted[0].attempt), (2, 2));
}

#[tokio::test]
async fn retry_fails_the_session_after_three_invalid_answers() {
    let h = Harness::memory(
        &json_output(Some("retry")),
        vec![
            Step::say("Done."),
            Step::say(r#"{"refund_id": 7, "status": "issued"}"#),
            Step::say(r#"{"status": "issued", "extra": true}"#),
            Step::say(VALID),
        ],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    let error = done.error.unwrap();
    assert!(
        error.starts_with("the output is still invalid after 3 attempts (on_invalid: retry)"),
        "{error}"
    );
    assert!(
        error.contains("\"refund_id\" is a required property"),
        "{error}"
    );
    assert!(
        error.contains("Additional properties are not allowed"),
        "{error}"
    );
    assert_eq!(
        h.script.requests().len(),
        3,
        "three answers, no fourth request"
    );
    let (invalid, accepted) = output_events(&h, &s.id).await;
    let actions: Vec<_> = invalid.iter().map(|i| (i.attempt, i.action)).collect();
    assert_eq!(
        actions,
        [
            (1, OutputAction::Retry),
            (2, OutputAction::Retry),
            (3, OutputAction::Fail)
        ]
    );
    assert!(
        invalid[1].errors[0].starts_with("/refund_id: 7 is not of type"),
        "{:?}",
        invalid[1]
    );
    assert!(invalid[2].feedback.is_none());
    assert!(accepted.is_empty());
}

#[tokio::test]
async fn repair_asks_once_for_a_corrected_answer() {
    let h = Harness::memory(
        &json_output(Some("repair")),
        vec![Step::say(r#"{"refund_id": "rf_2891"}"#), Step::say(VALID)],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    assert_eq!(done.output.unwrap()["json"]["status"], "issued");
    let feedback = last_user_text(&h, 1);
    assert!(
        feedback.starts_with("Your previous answer is not valid output"),
        "{feedback}"
    );
    assert!(feedback.contains("Repair it"), "{feedback}");
    assert!(
        feedback.contains("\"status\" is a required property"),
        "{feedback}"
    );
    let (invalid, _) = output_events(&h, &s.id).await;
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0].action, OutputAction::Repair);
}

#[tokio::test]
async fn repair_fails_when_the_corrected_answer_is_still_invalid() {
    let h = Harness::memory(
        &json_output(Some("repair")),
        vec![
            Step::say(r#"{"refund_id": "rf_2891"}"#),
            Step::say("Sorry, here it is: rf_2891"),
            Step::say(VALID),
        ],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    let error = done.error.unwrap();
    assert!(
        error.starts_with("the output is still invalid after a repair (on_invalid: repair)"),
        "{error}"
    );
    assert!(error.contains("not JSON"), "{error}");
    assert_eq!(h.script.requests().len(), 2, "one repair only");
    let (invalid, _) = output_events(&h, &s.id).await;
    let actions: Vec<_> = invalid.iter().map(|i| i.action).collect();
    assert_eq!(actions, [OutputAction::Repair, OutputAction::Fail]);
}

#[tokio::test]
async fn fail_and_the_default_fail_the_session_at_the_first_invalid_answer() {
    for on_invalid in [Some("fail"), None] {
        let h = Harness::memory(
            &json_output(on_invalid),
            vec![Step::say(r#"{"refund_id": "rf_2891"}"#), Step::say(VALID)],
        )
        .await;
        let s = h.start("Refund ORD-1.").await;
        let done = h.wait_end(&s.id).await;
        assert_eq!(done.status, SessionStatus::Failed, "{on_invalid:?}");
        assert_eq!(
            done.error.unwrap(),
            "the output is invalid (on_invalid: fail); the final answer of turn 1 does not match \
             output.format json: /: \"status\" is a required property"
        );
        assert_eq!(h.script.requests().len(), 1);
        let (invalid, accepted) = output_events(&h, &s.id).await;
        assert_eq!(invalid.len(), 1);
        assert_eq!(invalid[0].on_invalid, OutputAction::Fail);
        assert_eq!(invalid[0].action, OutputAction::Fail);
        assert!(accepted.is_empty());
    }
}

#[tokio::test]
async fn escalate_lets_a_human_accept_an_invalid_answer() {
    let answer = "The refund rf_2891 was issued.";
    let h = Harness::memory(&json_output(Some("escalate")), vec![Step::say(answer)]).await;
    let s = h.start("Refund ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    assert_eq!(approval.tool, OUTPUT_TOOL);
    assert_eq!(approval.args["answer"], answer);
    assert!(
        approval.args["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("not JSON"),
        "{}",
        approval.args
    );
    assert!(
        approval
            .reason
            .contains("does not match the agent's output format")
    );
    let answered = h
        .engine
        .vote(
            VoteTarget::Approval(approval.id),
            approve("alice", "fine as text"),
        )
        .await
        .unwrap();
    assert_eq!(answered.approval.status, ApprovalStatus::Approved);
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{:?}", done.error);
    let output = done.output.unwrap();
    assert_eq!(output["json"], Value::String(answer.to_owned()));
    let (invalid, accepted) = output_events(&h, &s.id).await;
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0].action, OutputAction::Escalate);
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].accepted_by.as_deref(), Some("alice"));
    assert_eq!(accepted[0].approval_id, Some(approval.id));
    assert_eq!(h.script.requests().len(), 1, "the model is not asked again");
    // The pseudo call is not part of the model's conversation, nor sent to a worker.
    assert!(h.worker.tools().is_empty());
}

#[tokio::test]
async fn escalate_rejected_fails_the_session() {
    let h = Harness::memory(
        &json_output(Some("escalate")),
        vec![Step::say(r#"{"refund_id": 7, "status": "issued"}"#)],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine
        .vote(
            VoteTarget::Approval(approval.id),
            reject("alice", "wrong id type"),
        )
        .await
        .unwrap();
    let done = h.wait_end(&s.id).await;
    assert_eq!(done.status, SessionStatus::Failed);
    let error = done.error.unwrap();
    assert!(
        error.starts_with("the output was rejected by alice: wrong id type (on_invalid: escalate)"),
        "{error}"
    );
    assert!(error.contains("/refund_id: 7 is not of type"), "{error}");
    let (_, accepted) = output_events(&h, &s.id).await;
    assert!(accepted.is_empty());
}

#[tokio::test]
async fn a_strict_schema_is_sent_to_the_provider() {
    let mut opts = json_output(Some("retry"));
    opts.output = opts.output.map(|o| format!("  strict: true\n{o}"));
    let h = Harness::memory(&opts, vec![Step::say(VALID)]).await;
    let s = h.start("Refund ORD-1.").await;
    assert_eq!(h.wait_end(&s.id).await.status, SessionStatus::Completed);
    let sent = h.script.requests()[0].response_schema.clone().unwrap();
    assert_eq!(sent.name, "refund-agent");
    assert!(sent.strict);
    assert_eq!(sent.schema["required"], json!(["refund_id", "status"]));
}

/// Stops the engine while the output escalation waits, decides it (or not) meanwhile, and
/// starts a new engine on the same store: the decision is applied once, the model is not
/// asked again.
async fn restart_during_output_escalation(
    decide_while_stopped: Option<bool>,
) -> (Harness, Engine, String, uuid::Uuid) {
    let h = Harness::memory(
        &json_output(Some("escalate")),
        vec![Step::say("rf_2891 issued")],
    )
    .await;
    let s = h.start("Refund ORD-1.").await;
    h.wait(&s.id, &[SessionStatus::AwaitingApproval]).await;
    let approval = h.pending_approval(&s.id).await;
    h.engine.shutdown();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let vote = |approve_it: bool| {
        if approve_it {
            approve("alice", "ok")
        } else {
            reject("alice", "not usable")
        }
    };
    if let Some(approve_it) = decide_while_stopped {
        // Recorded by another process: the ledger takes it without a driver.
        h.store
            .cast_vote(approval.id, vote(approve_it))
            .await
            .unwrap();
    }
    let script = phrony_test_support::fake_model::Script::new(Vec::new());
    let engine = Engine::new(EngineDeps {
        store: h.store.clone(),
        router: Some(h.router.clone()),
        providers: std::sync::Arc::new(ScriptedFactory(script.clone())),
        clock: h.clock.clone(),
        config: test_config(),
    });
    engine.recover().await.unwrap();
    if decide_while_stopped.is_none() {
        engine
            .vote(VoteTarget::Approval(approval.id), vote(true))
            .await
            .unwrap();
    }
    assert!(script.requests().is_empty(), "the model is not asked again");
    (h, engine, s.id, approval.id)
}

#[tokio::test]
async fn an_output_escalation_survives_a_restart() {
    for decide_while_stopped in [None, Some(true)] {
        let (h, engine, id, approval_id) =
            restart_during_output_escalation(decide_while_stopped).await;
        let done = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            engine.wait_for(&id, &[]),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            done.status,
            SessionStatus::Completed,
            "{decide_while_stopped:?}: {:?}",
            done.error
        );
        assert_eq!(done.output.unwrap()["json"], "rf_2891 issued");
        let (invalid, accepted) = output_events(&h, &id).await;
        assert_eq!(invalid.len(), 1, "the answer is checked once");
        assert_eq!(accepted.len(), 1);
        assert_eq!(accepted[0].approval_id, Some(approval_id));
    }
}

#[tokio::test]
async fn an_output_rejected_while_the_engine_was_stopped_fails_with_the_output_message() {
    let (_h, engine, id, _) = restart_during_output_escalation(Some(false)).await;
    let done = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        engine.wait_for(&id, &[]),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(done.status, SessionStatus::Failed);
    let error = done.error.unwrap();
    assert!(
        error.starts_with("the output was rejected by alice: not usable (on_invalid: escalate)"),
        "{error}"
    );
}
