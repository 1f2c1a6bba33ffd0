//! A property test of the approval state machine on the real ledger (SQLite): any interleaving
//! of votes (approve and reject, by distinct and repeated voters — names differing only in case
//! are one voter —, verified and unverified), timeouts at or before the expiry and the session's
//! cancellation is accepted or refused exactly as a small model of the rules says, and ends in
//! exactly one outcome: at most one `approval.decided` event, present exactly when the status is
//! terminal and naming that status, one `approval.vote` event per accepted vote, and a quorum
//! counted over distinct voters.
//!
//! The model restates the rules of `Ledger::cast_vote`, `Vote::check_voter` and
//! `Ledger::expire_approval`; the ledger is only used through its public API.

use std::collections::BTreeSet;

use chrono::Duration;
use phrony_ledger::{
    Approval, ApprovalStatus, ApprovalTimeout, Attribution, Backend, Ledger, NewApproval,
    NewSession, NewToolCall, OnModify, OnReject, SessionMode, SessionStatus, StatusChange,
    TimeoutDefault, Verification, Vote, VoteDecision, new_session_id,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, json};
use uuid::Uuid;

use crate::harness::TestDb;
use crate::session_cases::{deploy_agent, refund_agent};

/// Voter names: `alice` starts every session; `ALICE` is the same voter as `alice`.
const VOTERS: [&str; 5] = ["alice", "ALICE", "bob", "carol", "dave"];
const STARTER: &str = "alice";

#[derive(Debug, Clone)]
enum Step {
    Vote {
        voter: usize,
        verified: bool,
        approve: bool,
    },
    /// The timer fires: after the expiry, or early (one minute after opening).
    Expire { after: bool },
    /// The session is cancelled (a terminal transition closes pending approvals).
    Cancel,
}

#[derive(Debug, Clone)]
struct Scenario {
    verified_session: bool,
    allow_self_approval: bool,
    quorum: u32,
    timeout: Option<TimeoutDefault>,
    steps: Vec<Step>,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..VOTERS.len(), any::<bool>(), prop::bool::weighted(0.8)).prop_map(
            |(voter, verified, approve)| Step::Vote { voter, verified, approve }
        ),
        1 => any::<bool>().prop_map(|after| Step::Expire { after }),
        1 => Just(Step::Cancel),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        any::<bool>(),
        any::<bool>(),
        1u32..=3,
        prop::option::of(prop::sample::select(vec![
            TimeoutDefault::Deny,
            TimeoutDefault::Allow,
        ])),
        prop::collection::vec(step(), 1..10),
    )
        .prop_map(
            |(verified_session, allow_self_approval, quorum, timeout, steps)| Scenario {
                verified_session,
                allow_self_approval,
                quorum,
                timeout,
                steps,
            },
        )
}

/// The rules, restated.
#[derive(Debug)]
struct Model<'s> {
    scenario: &'s Scenario,
    status: ApprovalStatus,
    /// Every accepted voter, lower-cased (one vote per voter, whatever its decision).
    voters: Vec<String>,
    /// Distinct voters who approved.
    approvers: BTreeSet<String>,
    session_ended: bool,
}

impl Model<'_> {
    /// Whether the ledger must accept `step`; applies it when it does.
    fn apply(&mut self, step: &Step) -> bool {
        let pending = self.status == ApprovalStatus::Pending;
        match *step {
            Step::Vote {
                voter,
                verified,
                approve,
            } => {
                let name = VOTERS[voter].to_lowercase();
                let may_vote = !self.scenario.verified_session
                    || (verified && (self.scenario.allow_self_approval || name != STARTER));
                if !pending || self.voters.contains(&name) || !may_vote {
                    return false;
                }
                self.voters.push(name.clone());
                if !approve {
                    self.status = ApprovalStatus::Denied;
                } else {
                    self.approvers.insert(name);
                    if self.approvers.len() >= self.scenario.quorum as usize {
                        self.status = ApprovalStatus::Approved;
                    }
                }
                true
            }
            Step::Expire { after } => {
                let Some(default) = self.scenario.timeout.filter(|_| pending && after) else {
                    return false;
                };
                self.status = match default {
                    TimeoutDefault::Allow => ApprovalStatus::Approved,
                    _ => ApprovalStatus::Denied,
                };
                true
            }
            Step::Cancel => {
                if self.session_ended {
                    return false;
                }
                self.session_ended = true;
                if pending {
                    self.status = ApprovalStatus::Cancelled;
                }
                true
            }
        }
    }
}

fn attribution(name: &str, verified: bool) -> Attribution {
    Attribution {
        actor: name.to_owned(),
        verification: if verified {
            Verification::Token
        } else {
            Verification::Unverified
        },
        via: None,
    }
}

/// A session started by `alice` (verified or not) waiting on one refund call, and an approval
/// for it shaped by the scenario.
async fn open(
    ledger: &Ledger,
    v: &phrony_ledger::AgentVersion,
    s: &Scenario,
) -> (String, Approval) {
    let session = ledger
        .create_session(NewSession {
            id: new_session_id(),
            agent_version_id: v.id,
            agent: phrony_ledger::AgentVersionRef::new(
                &v.agent.namespace,
                &v.agent.name,
                &v.version,
            ),
            input: json!({"message": "refund order ORD-1"}),
            metadata: std::collections::BTreeMap::new(),
            mode: SessionMode::Task,
            parent_session_id: None,
            limits: None,
            bundle_version_id: None,
            secrets: Vec::new(),
            actor: attribution(STARTER, s.verified_session),
        })
        .await
        .unwrap();
    ledger
        .set_session_status(&session.id, StatusChange::to(SessionStatus::AwaitingTool))
        .await
        .unwrap();
    let call = ledger
        .record_tool_call(NewToolCall {
            session_id: session.id.clone(),
            turn: 1,
            iteration: 0,
            index: 0,
            tool: "payments.issue-refund".to_owned(),
            version: "1.0.0".to_owned(),
            wire_name: Some("issue_refund".to_owned()),
            args: json!({"order_id": "ORD-1", "amount": 400}),
            side_effect_class: Some(phrony_ledger::SideEffectClass::NonIdempotentWrite),
            delegation: None,
        })
        .await
        .unwrap();
    let approval = ledger
        .open_approval(NewApproval {
            id: Uuid::new_v4(),
            session_id: session.id.clone(),
            call_id: call.call_id.clone(),
            kind: phrony_ledger::ApprovalKind::Policy,
            policy_ref: Some("payments/refund-approval-boundary@1.0.0".to_owned()),
            reason: "Refunds over 250 need a human".to_owned(),
            route: "refund-approvers".to_owned(),
            authority_ref: "payments-authority".to_owned(),
            approvals_required: s.quorum,
            allow_self_approval: s.allow_self_approval,
            comprehension_required: false,
            on_reject: OnReject::ReturnToAgent,
            on_modify: OnModify::Unchecked,
            timeout: s.timeout.map(|default| ApprovalTimeout {
                after_minutes: 5,
                default,
                escalate_to_route: None,
                escalate_after_minutes: None,
            }),
            policy_runtime: Map::new(),
            actor: Attribution::unverified("policy"),
        })
        .await
        .unwrap();
    (session.id, approval)
}

async fn run(
    ledger: &Ledger,
    v: &phrony_ledger::AgentVersion,
    s: Scenario,
) -> Result<(), TestCaseError> {
    let (session, approval) = open(ledger, v, &s).await;
    let id = approval.id;
    let mut model = Model {
        scenario: &s,
        status: ApprovalStatus::Pending,
        voters: Vec::new(),
        approvers: BTreeSet::new(),
        session_ended: false,
    };
    for (i, step) in s.steps.iter().enumerate() {
        let before = model.status;
        let expected = model.apply(step);
        let accepted = match *step {
            Step::Vote {
                voter,
                verified,
                approve,
            } => {
                let decision = if approve {
                    VoteDecision::Approve
                } else {
                    VoteDecision::Reject
                };
                let vote = Vote::new(attribution(VOTERS[voter], verified), decision, "");
                match ledger.cast_vote(id, vote).await {
                    Ok(outcome) => {
                        prop_assert_eq!(
                            outcome.decided,
                            before == ApprovalStatus::Pending && model.status != before,
                            "step {}: `decided` disagrees with the status change",
                            i
                        );
                        true
                    }
                    Err(_) => false,
                }
            }
            Step::Expire { after } => {
                let minutes = if after { 6 } else { 1 };
                let now = approval.created_at + Duration::minutes(minutes);
                ledger.expire_approval(id, now).await.is_ok()
            }
            Step::Cancel => ledger
                .set_session_status(&session, StatusChange::to(SessionStatus::Cancelled))
                .await
                .is_ok(),
        };
        prop_assert_eq!(
            accepted,
            expected,
            "step {} ({:?}) after {:?}: the ledger and the rules disagree",
            i,
            step,
            &s.steps[..i]
        );
        let now = ledger.get_approval(id).await.unwrap();
        prop_assert_eq!(now.status, model.status, "step {}: status", i);
        prop_assert_eq!(
            now.approvals_received as usize,
            model.approvers.len(),
            "step {}: the quorum counts distinct approving voters",
            i
        );
        prop_assert_eq!(now.votes.len(), model.voters.len(), "step {}: votes", i);
    }

    let events = ledger.events_after(&session, 0, 1000).await.unwrap();
    let of_this = |kind: &str| {
        events
            .iter()
            .filter(|e| e.event_type == kind && e.payload["approval_id"] == json!(id))
            .collect::<Vec<_>>()
    };
    let decided = of_this("approval.decided");
    let terminal = model.status != ApprovalStatus::Pending;
    prop_assert_eq!(
        decided.len(),
        usize::from(terminal),
        "one approval.decided event exactly when the approval is decided ({:?})",
        model.status
    );
    if let Some(event) = decided.first() {
        prop_assert_eq!(
            event.payload["status"].as_str(),
            Some(model.status.as_str()),
            "the decided event names the final status"
        );
    }
    prop_assert_eq!(of_this("approval.vote").len(), model.voters.len());
    Ok(())
}

/// 64 generated interleavings, each on a fresh session of one migrated SQLite ledger.
#[test]
fn any_interleaving_of_votes_timeouts_and_cancellation_ends_in_one_outcome() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = runtime
        .block_on(TestDb::new(Backend::Sqlite))
        .expect("SQLite is always available");
    let ledger = runtime.block_on(db.migrated()).clone();
    let v = runtime.block_on(deploy_agent(&ledger, &refund_agent(), "0.1.0"));
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&scenario(), |s| runtime.block_on(run(&ledger, &v, s)));
    if let Err(e) = result {
        panic!("{e}");
    }
}
