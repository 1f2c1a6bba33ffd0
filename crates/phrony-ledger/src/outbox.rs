//! Which events notify webhooks, as what (issue #19): [`notification`], one exhaustive match on
//! [`EventBody`], so a new event kind does not compile until it decides; the routes the ledger
//! was given ([`crate::Ledger::with_webhooks`]) and the sender's wake-up. A leaf below `db`: the
//! append path (`events::append_batch`) writes the outbox rows through it in the event's
//! transaction; the delivery state machine is `webhooks.rs`. [`NOTIFYING_TYPES`] is the cheap
//! filter in front of the decode (only those types are decoded), kept equal to the match's
//! `Some` arms by `the_type_filter_matches_the_rule` below.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::event_body::{EventBody, event_types as types};
use crate::vocabulary::{ApprovalStatus, TIMEOUT_ACTOR};

/// What a notifying event is, as webhooks name it (`events:` in the webhooks file, `type` in
/// the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotificationKind {
    /// `approval.required`: an approval was opened (including the new approval of an
    /// escalation).
    ApprovalRequired,
    /// `approval.decided`: approvers approved or rejected it.
    ApprovalDecided,
    /// `approval.expired`: its timeout applied the default `allow` or `deny`.
    ApprovalExpired,
    /// `approval.escalated`: its timeout escalated it to a new approval.
    ApprovalEscalated,
    /// `session.failed`.
    SessionFailed,
}

impl NotificationKind {
    /// Every kind.
    pub const ALL: [Self; 5] = [
        Self::ApprovalRequired,
        Self::ApprovalDecided,
        Self::ApprovalExpired,
        Self::ApprovalEscalated,
        Self::SessionFailed,
    ];

    /// The kind's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApprovalRequired => "approval.required",
            Self::ApprovalDecided => "approval.decided",
            Self::ApprovalExpired => "approval.expired",
            Self::ApprovalEscalated => "approval.escalated",
            Self::SessionFailed => "session.failed",
        }
    }

    /// The kind named `name`, if any.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for NotificationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which notification an event is, if any: THE rule, one exhaustive match.
///
/// An approval closed without a decision (`cancelled`: its session ended, or the call's
/// outcome became known) does not notify; `approval.decided` by the timeout actor is
/// `approval.expired`.
#[must_use]
pub fn notification(body: &EventBody) -> Option<NotificationKind> {
    match body {
        EventBody::ApprovalRequired(_) => Some(NotificationKind::ApprovalRequired),
        EventBody::ApprovalDecided(d) => match d.status {
            ApprovalStatus::Cancelled | ApprovalStatus::Pending | ApprovalStatus::Escalated => None,
            ApprovalStatus::Approved | ApprovalStatus::Denied if d.decided_by == TIMEOUT_ACTOR => {
                Some(NotificationKind::ApprovalExpired)
            }
            ApprovalStatus::Approved | ApprovalStatus::Denied => {
                Some(NotificationKind::ApprovalDecided)
            }
        },
        EventBody::ApprovalEscalated(_) => Some(NotificationKind::ApprovalEscalated),
        EventBody::SessionFailed(_) => Some(NotificationKind::SessionFailed),
        EventBody::SessionStarted(_)
        | EventBody::SessionStatusChanged(_)
        | EventBody::SessionCompleted(_)
        | EventBody::SessionCancelled(_)
        | EventBody::SessionPrincipal(_)
        | EventBody::MessageUser(_)
        | EventBody::MessageAssistant(_)
        | EventBody::ModelCompletion(_)
        | EventBody::EvidenceRecorded(_)
        | EventBody::OutputInvalid(_)
        | EventBody::OutputAccepted(_)
        | EventBody::ToolRequested(_)
        | EventBody::ToolQueued(_)
        | EventBody::ToolDispatched(_)
        | EventBody::ToolCompleted(_)
        | EventBody::ToolLateResult(_)
        | EventBody::ToolIndeterminate(_)
        | EventBody::ToolPolicyDenied(_)
        | EventBody::ToolCancelled(_)
        | EventBody::ApprovalVote(_)
        | EventBody::AgentVersionPublished(_)
        | EventBody::AgentDeployed(_)
        | EventBody::AgentRolledBack(_)
        | EventBody::AgentActivationRefused(_)
        | EventBody::AgentVersionDeprecated(_)
        | EventBody::AgentVersionRetired(_)
        | EventBody::AgentArchived(_)
        | EventBody::BundleVersionPublished(_)
        | EventBody::BundleDeployed(_)
        | EventBody::BundleRolledBack(_)
        | EventBody::BundleActivationRefused(_)
        | EventBody::TokenCreated(_)
        | EventBody::TokenRevoked(_)
        | EventBody::AuditKeyIntroduced(_)
        | EventBody::AuditUnverifiedLogAllowed(_)
        | EventBody::WorkerDescriptorRefused(_)
        | EventBody::PolicyShadow(_)
        | EventBody::WebhookRetryRequested(_)
        | EventBody::WebhookUnconfigured(_) => None,
    }
}

/// The stored types whose [`notification`] arm can be `Some`: the append path decodes only
/// these.
pub(crate) const NOTIFYING_TYPES: &[&str] = &[
    types::APPROVAL_REQUIRED,
    types::APPROVAL_DECIDED,
    types::APPROVAL_ESCALATED,
    types::SESSION_FAILED,
];

/// One configured webhook as the ledger sees it: its name and the kinds it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRoute {
    /// The webhook's name (unique in the configuration).
    pub name: String,
    /// The kinds it receives.
    pub kinds: Vec<NotificationKind>,
}

/// The ledger's webhook configuration: routes and the wake-up of the sender.
#[derive(Debug)]
pub(crate) struct Outbox {
    pub(crate) routes: Vec<WebhookRoute>,
    pub(crate) wake: Arc<Notify>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_body::{ApprovalDecided, SessionTransition, WebhookRetryRequested};
    use crate::vocabulary::OnReject;
    use uuid::Uuid;
    fn decided(status: ApprovalStatus, by: &str) -> EventBody {
        EventBody::ApprovalDecided(ApprovalDecided {
            approval_id: Uuid::nil(),
            call_id: "c".into(),
            status,
            approved: status == ApprovalStatus::Approved,
            decided_by: by.into(),
            comment: String::new(),
            on_reject: OnReject::ReturnToAgent,
            effective_args: None,
            resolution: None,
        })
    }

    #[test]
    fn decisions_expiries_and_cancellations_are_told_apart() {
        let human = "alice";
        let timeout = TIMEOUT_ACTOR;
        assert_eq!(
            notification(&decided(ApprovalStatus::Approved, human)),
            Some(NotificationKind::ApprovalDecided)
        );
        assert_eq!(
            notification(&decided(ApprovalStatus::Denied, human)),
            Some(NotificationKind::ApprovalDecided)
        );
        assert_eq!(
            notification(&decided(ApprovalStatus::Denied, timeout)),
            Some(NotificationKind::ApprovalExpired)
        );
        assert_eq!(
            notification(&decided(ApprovalStatus::Approved, timeout)),
            Some(NotificationKind::ApprovalExpired)
        );
        assert_eq!(
            notification(&decided(ApprovalStatus::Cancelled, human)),
            None
        );
    }

    #[test]
    fn the_type_filter_matches_the_rule() {
        // Every type the filter lets through has a body that notifies, and the bodies that
        // notify are of types the filter lets through.
        let failed = EventBody::SessionFailed(SessionTransition {
            from: crate::vocabulary::SessionStatus::Running,
            to: crate::vocabulary::SessionStatus::Failed,
            reason: None,
            message: Some("boom".into()),
            output: None,
        });
        let notifying = [failed, decided(ApprovalStatus::Approved, "a")];
        for body in &notifying {
            assert!(notification(body).is_some());
            assert!(NOTIFYING_TYPES.contains(&body.event_type()));
        }
        for t in NOTIFYING_TYPES {
            assert!(
                [
                    types::APPROVAL_REQUIRED,
                    types::APPROVAL_DECIDED,
                    types::APPROVAL_ESCALATED,
                    types::SESSION_FAILED
                ]
                .contains(t)
            );
        }
        let quiet = EventBody::WebhookRetryRequested(WebhookRetryRequested {
            delivery_id: Uuid::nil(),
            webhook: "w".into(),
            kind: "approval.required".into(),
            stream: "s".into(),
            seq: 1,
            attempts: 3,
        });
        assert_eq!(notification(&quiet), None);
        assert!(!NOTIFYING_TYPES.contains(&quiet.event_type()));
    }

    #[test]
    fn kinds_round_trip_their_names() {
        for kind in NotificationKind::ALL {
            assert_eq!(NotificationKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(NotificationKind::parse("approval.vote"), None);
    }
}
