//! [`Client`]: run agents and wait for them, review approvals, look at sessions.
//!
//! The shape follows the tutorial's backend integration: `client.run(agent, input, metadata)`
//! returns a [`Session`] whose [`wait`](Session::wait) resolves to its [`SessionResult`];
//! `client.approvals()` lists, reads, approves and rejects pending approvals and
//! [`watch`](Approvals::watch)es for new ones (pushed by the runtime); `client.sessions()` lists, inspects and cancels.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use futures::Stream;
use phrony_client::{
    AgentName, Approval, ApprovalFilter, ClientError, ClientTls, DecideApproval, Decision,
    DecisionOutcome, RunSession, SessionFilter, SessionInspection, SessionPage,
};
use serde_json::Value;

/// The first pause between two looks at a session in [`Session::wait`]; it doubles up to
/// [`MAX_POLL`].
const MIN_POLL: Duration = Duration::from_millis(50);
/// The longest pause between two looks in [`Session::wait`].
pub const MAX_POLL: Duration = Duration::from_secs(1);

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime refused the call or could not be reached (the gRPC code and message kept).
    #[error(transparent)]
    Runtime(#[from] ClientError),
    /// An agent reference that is not `namespace/name` or `namespace/name@version`.
    #[error("invalid agent reference {given:?}: {reason}")]
    InvalidAgentRef {
        /// The reference as given.
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The actor name cannot be used.
    #[error("invalid actor {given:?}: {reason}")]
    InvalidActor {
        /// The actor as given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`Session::wait_for`] gave up before the session ended.
    #[error("session {session_id} did not end within {}s (last status {status})", waited.as_secs())]
    WaitTimeout {
        /// The session.
        session_id: String,
        /// Its status at the last look.
        status: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The runtime sent a session's JSON output that does not parse.
    #[error("session {session_id}: the runtime sent a JSON output that does not parse: {reason}")]
    InvalidOutput {
        /// The session.
        session_id: String,
        /// The parser's message.
        reason: String,
    },
}

/// Connection settings for [`Client::connect_with`].
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// An API token sent as `authorization: Bearer …` (the runtime's `required` mode).
    pub token: Option<String>,
    /// TLS settings (the runtime's CA, a client certificate for mutual TLS).
    pub tls: Option<ClientTls>,
    /// The actor recorded for runs and votes when the runtime verifies no credential (`local`
    /// mode); default `sdk`. With a verified credential the runtime records its principal.
    pub actor: Option<String>,
}

/// A connection to the runtime. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    inner: phrony_client::Client,
    actor: String,
}

impl Client {
    /// Connects to the runtime at `addr` (`host:port` or `http://host:port`) without a
    /// credential, as actor `sdk`.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the address is invalid or nothing answers there.
    pub async fn connect(addr: &str) -> Result<Self, Error> {
        Self::connect_with(addr, ClientOptions::default()).await
    }

    /// Connects with a token, TLS and an actor name.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`Error::InvalidActor`] for an actor name the runtime
    /// would refuse.
    pub async fn connect_with(addr: &str, options: ClientOptions) -> Result<Self, Error> {
        let actor = options.actor.unwrap_or_else(|| "sdk".to_owned());
        phrony_client::Actor::parse(&actor).map_err(|e| Error::InvalidActor {
            given: actor.clone(),
            reason: e.to_string(),
        })?;
        let inner = phrony_client::Client::connect_with(
            addr,
            options.tls.as_ref(),
            options.token.as_deref(),
        )
        .await?;
        Ok(Self { inner, actor })
    }

    /// The typed client underneath, for every other RPC (publish, deploy, audit…).
    #[must_use]
    pub fn raw(&self) -> &phrony_client::Client {
        &self.inner
    }

    /// The actor this client names.
    #[must_use]
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Starts a task session of `agent` (`namespace/name`, or `namespace/name@version` to
    /// insist on the active version) with `input` (a JSON object or string) and `metadata`
    /// labels. The session runs in the background; [`Session::wait`] waits for its end.
    ///
    /// # Errors
    /// [`Error::InvalidAgentRef`]; [`Error::Runtime`] when nothing runnable is deployed, the
    /// input is refused, or any other refusal.
    pub async fn run(
        &self,
        agent: &str,
        input: Value,
        metadata: BTreeMap<String, String>,
    ) -> Result<Session, Error> {
        let (name, version) = parse_agent_ref(agent)?;
        let mut run = RunSession::new(name);
        run.version = version;
        run.input = Some(input);
        run.metadata = metadata;
        let started = self.inner.run_session(&run, &self.actor).await?;
        Ok(Session {
            client: self.clone(),
            id: started.session_id,
        })
    }

    /// A handle on an existing session.
    #[must_use]
    pub fn session(&self, session_id: &str) -> Session {
        Session {
            client: self.clone(),
            id: session_id.to_owned(),
        }
    }

    /// The approvals API.
    #[must_use]
    pub fn approvals(&self) -> Approvals<'_> {
        Approvals { client: self }
    }

    /// The sessions API.
    #[must_use]
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions { client: self }
    }
}

/// Splits `namespace/name[@version]`.
fn parse_agent_ref(given: &str) -> Result<(AgentName, Option<String>), Error> {
    let bad = |reason| Error::InvalidAgentRef {
        given: given.to_owned(),
        reason,
    };
    let (path, version) = match given.split_once('@') {
        Some((path, version)) if !version.is_empty() => (path, Some(version.to_owned())),
        Some(_) => return Err(bad("the version after '@' is empty")),
        None => (given, None),
    };
    let (namespace, name) = path
        .split_once('/')
        .ok_or_else(|| bad("expected namespace/name"))?;
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err(bad("expected namespace/name"));
    }
    Ok((AgentName::new(namespace, name), version))
}

/// A session started by [`Client::run`].
#[derive(Clone)]
pub struct Session {
    client: Client,
    id: String,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").field("id", &self.id).finish()
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionResult {
    /// The session id.
    pub session_id: String,
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    /// The agent's last message, when it produced one.
    pub output: Option<String>,
    /// With the agent's `output.format: json`: the output the runtime accepted (the final
    /// answer parsed as JSON and checked against `output.schema`, or what a human accepted);
    /// `None` for free-text output.
    pub output_json: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
}

impl SessionResult {
    /// Whether the session completed.
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.status == "completed"
    }
}

impl Session {
    /// The session id (`run_…`).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its status now.
    ///
    /// # Errors
    /// [`Error::Runtime`].
    pub async fn status(&self) -> Result<String, Error> {
        let seen = self.client.inner.inspect_session_paged(&self.id, 1).await?;
        Ok(seen.session.status)
    }

    /// Waits until the session ends (also through approvals a human takes hours to decide).
    ///
    /// # Errors
    /// [`Error::Runtime`] when the runtime cannot be asked.
    pub async fn wait(&self) -> Result<SessionResult, Error> {
        self.wait_until(None).await
    }

    /// [`wait`](Self::wait), giving up after `timeout`.
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] naming the last status; [`Error::Runtime`].
    pub async fn wait_for(&self, timeout: Duration) -> Result<SessionResult, Error> {
        self.wait_until(Some(timeout)).await
    }

    async fn wait_until(&self, timeout: Option<Duration>) -> Result<SessionResult, Error> {
        let start = Instant::now();
        let mut pause = MIN_POLL;
        loop {
            let seen = self.client.inner.inspect_session_paged(&self.id, 1).await?;
            let session = seen.session;
            if matches!(
                session.status.as_str(),
                "completed" | "failed" | "cancelled"
            ) {
                let output_json = match session.truncation("output.json") {
                    // Too large to be sent inline: read whole.
                    Some(t) => {
                        let text = self.client.inner.session_payload(&t.reference).await?;
                        Some(
                            serde_json::from_slice(&text).map_err(|e| Error::InvalidOutput {
                                session_id: self.id.clone(),
                                reason: e.to_string(),
                            })?,
                        )
                    }
                    None => session.output.as_ref().and_then(|o| o.json.clone()),
                };
                return Ok(SessionResult {
                    session_id: self.id.clone(),
                    status: session.status,
                    output: session.output.map(|o| o.message).filter(|m| !m.is_empty()),
                    output_json,
                    error: session.error,
                });
            }
            if let Some(limit) = timeout
                && start.elapsed() >= limit
            {
                return Err(Error::WaitTimeout {
                    session_id: self.id.clone(),
                    status: session.status,
                    waited: limit,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// Cancels the session.
    ///
    /// # Errors
    /// [`Error::Runtime`].
    pub async fn cancel(&self) -> Result<(), Error> {
        self.client.sessions().cancel(&self.id).await
    }
}

/// The approvals API ([`Client::approvals`]).
#[derive(Debug, Clone, Copy)]
pub struct Approvals<'a> {
    client: &'a Client,
}

impl Approvals<'_> {
    /// Every approval with this status (`pending`, `approved`, `denied`, `expired`…; `None`:
    /// any), newest first, all pages.
    ///
    /// # Errors
    /// [`Error::Runtime`].
    pub async fn list(&self, status: Option<&str>) -> Result<Vec<Approval>, Error> {
        let mut filter = ApprovalFilter {
            status: status.map(str::to_owned),
            ..ApprovalFilter::default()
        };
        let mut all = Vec::new();
        loop {
            let page = self.client.inner.list_approvals(&filter).await?;
            all.extend(page.approvals);
            match page.next_page_token {
                Some(token) => filter.page_token = Some(token),
                None => return Ok(all),
            }
        }
    }

    /// One approval, with its votes.
    ///
    /// # Errors
    /// [`Error::Runtime`] (`NotFound` for an unknown id).
    pub async fn get(&self, approval_id: &str) -> Result<Approval, Error> {
        Ok(self.client.inner.get_approval(approval_id).await?)
    }

    /// Approves, with an optional comment.
    ///
    /// # Errors
    /// [`Error::Runtime`]: `FailedPrecondition` when already decided or already voted,
    /// `PermissionDenied` when this actor may not vote on it.
    pub async fn approve(
        &self,
        approval_id: &str,
        comment: Option<&str>,
    ) -> Result<DecisionOutcome, Error> {
        self.vote(approval_id, Decision::Approve, comment).await
    }

    /// Rejects, with an optional comment (the policy decides whether the agent hears of it).
    ///
    /// # Errors
    /// As [`approve`](Self::approve).
    pub async fn reject(
        &self,
        approval_id: &str,
        comment: Option<&str>,
    ) -> Result<DecisionOutcome, Error> {
        self.vote(approval_id, Decision::Reject, comment).await
    }

    async fn vote(
        &self,
        approval_id: &str,
        decision: Decision,
        comment: Option<&str>,
    ) -> Result<DecisionOutcome, Error> {
        self.decide(&DecideApproval {
            approval_id: approval_id.to_owned(),
            decision,
            comment: comment.map(str::to_owned),
            args: None,
            comprehension_acknowledged: false,
            resolution: None,
            result: None,
        })
        .await
    }

    /// Any vote (edited arguments, comprehension acknowledged, an outcome review's resolution).
    ///
    /// # Errors
    /// As [`approve`](Self::approve).
    pub async fn decide(&self, vote: &DecideApproval) -> Result<DecisionOutcome, Error> {
        Ok(self
            .client
            .inner
            .decide_approval(vote, &self.client.actor)
            .await?)
    }

    /// The approvals pending now, oldest first, then each approval as it becomes pending, each
    /// once — pushed by the runtime (`WatchApprovals`), not polled. The stream ends after the
    /// first error it yields (the runtime stopped, or ended a watcher that did not read); open a
    /// new watch to go on: it starts again with the pending set, so skip the ids already seen.
    pub fn watch(&self) -> impl Stream<Item = Result<Approval, Error>> + '_ {
        enum State {
            Start,
            Open(Box<phrony_client::ApprovalWatch>),
            Done,
        }
        futures::stream::unfold(
            (State::Start, BTreeSet::<String>::new()),
            move |(mut state, mut seen)| async move {
                loop {
                    match state {
                        State::Done => return None,
                        State::Start => {
                            let filter = ApprovalFilter {
                                status: Some("pending".to_owned()),
                                ..ApprovalFilter::default()
                            };
                            match self.client.inner.watch_approvals(&filter).await {
                                Ok(watch) => state = State::Open(Box::new(watch)),
                                Err(e) => return Some((Err(e.into()), (State::Done, seen))),
                            }
                        }
                        State::Open(mut watch) => match watch.next().await {
                            Ok(Some(phrony_client::ApprovalChange {
                                kind: phrony_client::ApprovalChangeKind::Opened,
                                approval: Some(approval),
                            })) if seen.insert(approval.id.clone()) => {
                                return Some((Ok(approval), (State::Open(watch), seen)));
                            }
                            // The end of the current set, votes and decisions: not new approvals.
                            Ok(Some(_)) => state = State::Open(watch),
                            Ok(None) => return None,
                            Err(e) => return Some((Err(e.into()), (State::Done, seen))),
                        },
                    }
                }
            },
        )
    }
}

/// The sessions API ([`Client::sessions`]).
#[derive(Debug, Clone, Copy)]
pub struct Sessions<'a> {
    client: &'a Client,
}

impl Sessions<'_> {
    /// One page of sessions matching `filter`, most recently updated first.
    ///
    /// # Errors
    /// [`Error::Runtime`].
    pub async fn list(&self, filter: &SessionFilter) -> Result<SessionPage, Error> {
        Ok(self.client.inner.list_sessions(filter).await?)
    }

    /// The session, its children and its timeline (the audit trail).
    ///
    /// # Errors
    /// [`Error::Runtime`] (`NotFound` for an unknown id).
    pub async fn inspect(&self, session_id: &str) -> Result<SessionInspection, Error> {
        Ok(self.client.inner.inspect_session(session_id).await?)
    }

    /// Cancels a live session.
    ///
    /// # Errors
    /// [`Error::Runtime`] (`FailedPrecondition` when it already ended).
    pub async fn cancel(&self, session_id: &str) -> Result<(), Error> {
        Ok(self
            .client
            .inner
            .cancel_session(session_id, &self.client.actor)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn agent_refs_parse_with_and_without_a_version() {
        let (name, version) = parse_agent_ref("support/refund-agent@0.1.0").unwrap();
        assert_eq!(name, AgentName::new("support", "refund-agent"));
        assert_eq!(version.as_deref(), Some("0.1.0"));
        assert_eq!(parse_agent_ref("support/refund-agent").unwrap().1, None);
        for bad in ["refund-agent", "/x", "support/", "a/b/c", "support/x@"] {
            let err = parse_agent_ref(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidAgentRef { .. }), "{bad}: {err}");
        }
    }
}
