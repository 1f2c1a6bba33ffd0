//! Secrets follow the deployed versions' endpoints: before a deploy or rollback activates a
//! version, the endpoints it sends its secrets to ([`ProviderFactory::secret_destinations`],
//! under the daemon's current provider configuration) are compared with those of every version
//! ever deployed. A secret's value (its `fromEnv` variable) sent to an endpoint no earlier
//! deployment sent it to is refused unless the deployer allows it; the activation event records
//! the endpoints and the allowed changes, and a refusal is recorded as an event too (who tried,
//! which version, which endpoints).
//!
//! Two forms, one rule: [`activate`] for an agent (the version's own destinations, compared with
//! those of every version in the agent's deployment history; refusals as
//! `agent.activation_refused`), and [`activate_bundle`] for a bundle (the destinations of every
//! member of the bundle version, each named by its child name, compared with those of every
//! member of every bundle version the bundle ever had deployed; refusals as
//! `bundle.activation_refused`). Both run [`checked_activation`]; only how a form reads its
//! history and writes its events differs ([`Form`]).
//!
//! The check reads the history before the ledger's write transaction. History only grows
//! (deployments are append-only, versions immutable), so a concurrent deployment can only turn a
//! refused change into an allowed one later, never let an unseen endpoint through.

use std::collections::{BTreeMap, BTreeSet};

use phrony_ledger::{
    AgentRef, AgentVersion, Attribution, BundleDeployment, BundleMember, BundleRef, Deployment,
    DeploymentAction, Ledger, LedgerError, SecretEndpoint, SecretEndpointChange,
    SecretEndpointRecord,
};
use phrony_manifest::CompiledAgent;
use uuid::Uuid;

use crate::provider::ProviderFactory;

/// A deploy or a rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation<'a> {
    /// `Deploy` of this version (for a bundle: its semver or lock hash).
    Deploy(&'a str),
    /// `Rollback` to this version, or (`None`) to the newest earlier deployment of another one.
    Rollback(Option<&'a str>),
}

impl Activation<'_> {
    fn action(self) -> DeploymentAction {
        match self {
            Self::Deploy(_) => DeploymentAction::Deploy,
            Self::Rollback(_) => DeploymentAction::Rollback,
        }
    }
}

/// A deploy or rollback that happened: an agent's ([`Deployment`]) or a bundle's
/// ([`BundleDeployment`], see [`ActivatedBundle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activated<D = Deployment> {
    /// The deployment row.
    pub deployment: D,
    /// Where the activated version sends its secrets (for a bundle: each member's, named by
    /// [`SecretEndpoint::member`]).
    pub endpoints: Vec<SecretEndpoint>,
    /// The secrets it sends to an endpoint no earlier deployment used (allowed by the caller).
    pub changes: Vec<SecretEndpointChange>,
}

/// A bundle deploy or rollback that happened.
pub type ActivatedBundle = Activated<BundleDeployment>;

/// Why an activation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// The ledger refused or failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The version sends a secret to an endpoint no earlier deployment used, and the caller did
    /// not allow it.
    #[error("{}", refusal(&agent.to_string(), "agents", version, changes))]
    NewSecretEndpoints {
        /// The agent.
        agent: AgentRef,
        /// The version that was to be activated.
        version: String,
        /// Each secret and its new endpoint.
        changes: Vec<SecretEndpointChange>,
    },
    /// A member of the bundle version sends a secret to an endpoint no earlier deployment of
    /// the bundle used, and the caller did not allow it.
    #[error("{}", refusal(&format!("bundle {bundle}"), "bundles", version, changes))]
    BundleNewSecretEndpoints {
        /// The bundle.
        bundle: BundleRef,
        /// The bundle version (its semver) that was to be activated.
        version: String,
        /// Each member's secret and its new endpoint.
        changes: Vec<SecretEndpointChange>,
    },
    /// A stored version is not a snapshot this build can read.
    #[error("stored version {version:?} of agent {agent} is not a readable snapshot: {reason}")]
    BadSnapshot {
        /// The agent (for a bundle member: the member's `metadata.namespace/name`).
        agent: AgentRef,
        /// The version.
        version: String,
        /// What is wrong.
        reason: String,
    },
}

/// One sentence per change, and how to proceed (`phrony <command> deploy/rollback …`).
fn refusal(
    subject: &str,
    command: &str,
    version: &str,
    changes: &[SecretEndpointChange],
) -> String {
    let each: Vec<String> = changes.iter().map(describe_change).collect();
    format!(
        "{subject}@{version} sends secrets to endpoints no earlier deployment of {subject} used: \
         {}; check that these endpoints are meant to receive them, then repeat with \
         allow_new_secret_endpoints (phrony {command} deploy/rollback \
         --allow-new-secret-endpoints)",
        each.join("; ")
    )
}

/// `secret "openai" (OPENAI_API_KEY) is now sent to B (previous deployments: A)`, after
/// `member "front-desk": ` for a bundle member's.
#[must_use]
pub fn describe_change(change: &SecretEndpointChange) -> String {
    let previous = if change.previous.is_empty() {
        format!("no earlier deployment sent {}", change.from_env)
    } else {
        format!("previous deployments: {}", change.previous.join(", "))
    };
    let member = change
        .member
        .as_ref()
        .map(|m| format!("member {m:?}: "))
        .unwrap_or_default();
    format!(
        "{member}secret {:?} ({}) is now sent to {} ({previous})",
        change.secret, change.from_env, change.endpoint
    )
}

/// Activates an agent version after checking where it sends its secrets (see the module docs);
/// `allow_new_endpoints` lets a change through, recorded in the event. The first deployment of
/// an agent changes nothing; a rollback to the previous deployment never does (the same version
/// was deployed before, and is compared under the same configuration).
///
/// # Errors
/// [`ActivationError::NewSecretEndpoints`] (a refusal: the gRPC edge answers
/// `FAILED_PRECONDITION`), the ledger's errors, and [`ActivationError::BadSnapshot`].
pub async fn activate(
    ledger: &Ledger,
    providers: &dyn ProviderFactory,
    agent: &AgentRef,
    activation: Activation<'_>,
    allow_new_endpoints: bool,
    actor: &Attribution,
) -> Result<Activated, ActivationError> {
    let form = AgentForm {
        ledger,
        providers,
        agent,
        actor,
    };
    checked_activation(&form, activation, allow_new_endpoints).await
}

/// Activates a bundle version (named by its semver or lock hash) after checking where its
/// members send their secrets: the union, per `fromEnv` variable, of every member's
/// destinations, against those of every member of every bundle version the bundle ever had
/// deployed. Otherwise as [`activate`]: the first deployment of a bundle changes nothing, a
/// rollback to a version deployed before never does, and a change needs `allow_new_endpoints`
/// (recorded in `bundle.deployed` / `bundle.rolled_back`; a refusal as
/// `bundle.activation_refused`).
///
/// # Errors
/// [`ActivationError::BundleNewSecretEndpoints`] (a refusal: `FAILED_PRECONDITION`), the
/// ledger's errors, and [`ActivationError::BadSnapshot`] for a member snapshot that does not
/// read.
pub async fn activate_bundle(
    ledger: &Ledger,
    providers: &dyn ProviderFactory,
    bundle: &BundleRef,
    activation: Activation<'_>,
    allow_new_endpoints: bool,
    actor: &Attribution,
) -> Result<ActivatedBundle, ActivationError> {
    let form = BundleForm {
        ledger,
        providers,
        bundle,
        actor,
    };
    checked_activation(&form, activation, allow_new_endpoints).await
}

/// A version to activate, as a form resolved it.
struct Target {
    /// Its label (an agent's version; a bundle's semver, also when named by its lock hash).
    version: String,
    /// Where it sends its secrets.
    endpoints: Vec<SecretEndpoint>,
}

/// What the rule needs of the thing activated, and how its events are written.
trait Form {
    /// A deployment row.
    type Deployment;

    /// `agent ns/name`, `bundle ns/name` (for the logs).
    fn subject(&self) -> String;

    /// Who activates.
    fn actor(&self) -> &Attribution;

    /// The deployment history, newest first: each row's version id and label.
    async fn history(&self) -> Result<Vec<(Uuid, String)>, ActivationError>;

    /// The version `version` names, and where it sends its secrets.
    async fn target(&self, version: &str) -> Result<Target, ActivationError>;

    /// Where the version with id `id` (from [`Form::history`]) sends its secrets.
    async fn endpoints_by_id(&self, id: Uuid) -> Result<Vec<SecretEndpoint>, ActivationError>;

    /// The refusal of `version` (the error the caller gets).
    fn refusal(&self, version: String, changes: Vec<SecretEndpointChange>) -> ActivationError;

    /// Records the refusal in the form's stream.
    async fn record_refusal(
        &self,
        version: &str,
        action: DeploymentAction,
        changes: &[SecretEndpointChange],
    ) -> Result<(), LedgerError>;

    /// Deploys `version`, or rolls back to it, recording `record` in the event.
    async fn activate(
        &self,
        action: DeploymentAction,
        version: &str,
        record: &SecretEndpointRecord,
    ) -> Result<Self::Deployment, LedgerError>;

    /// A rollback to the previous deployment when the history has none: the ledger names what
    /// is missing.
    async fn rollback_without_previous(&self) -> Result<Self::Deployment, LedgerError>;
}

/// The one implementation of the rule, for either form (see [`activate`]).
async fn checked_activation<F: Form>(
    form: &F,
    activation: Activation<'_>,
    allow_new_endpoints: bool,
) -> Result<Activated<F::Deployment>, ActivationError> {
    let history = form.history().await?;
    let requested = match activation {
        Activation::Deploy(version) | Activation::Rollback(Some(version)) => version.to_owned(),
        Activation::Rollback(None) => match previous_deployment(&history) {
            Some(version) => version,
            None => {
                return Ok(Activated {
                    deployment: form.rollback_without_previous().await?,
                    endpoints: Vec::new(),
                    changes: Vec::new(),
                });
            }
        },
    };
    let Target { version, endpoints } = form.target(&requested).await?;
    let changes = if history.is_empty() {
        Vec::new()
    } else {
        let mut earlier: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let ids: BTreeSet<Uuid> = history.iter().map(|(id, _)| *id).collect();
        for id in ids {
            for e in form.endpoints_by_id(id).await? {
                earlier.entry(e.from_env).or_default().insert(e.endpoint);
            }
        }
        new_endpoints(&endpoints, &earlier)
    };
    let subject = form.subject();
    if !changes.is_empty() && !allow_new_endpoints {
        tracing::warn!(
            %subject, %version, actor = %form.actor(), changes = ?changes,
            "refused an activation that sends secrets to new endpoints"
        );
        // The refusal stands whether or not it could be recorded: a failed record must not
        // turn a refused activation into an error that hides why it was refused.
        if let Err(e) = form
            .record_refusal(&version, activation.action(), &changes)
            .await
        {
            tracing::error!(%subject, %version, error = %e, "could not record a refused activation");
        }
        return Err(form.refusal(version, changes));
    }
    let record = SecretEndpointRecord { endpoints, changes };
    let deployment = form
        .activate(activation.action(), &version, &record)
        .await?;
    if !record.changes.is_empty() {
        tracing::warn!(
            %subject, %version, actor = %form.actor(), changes = ?record.changes,
            "activated a version that sends secrets to new endpoints, as the deployer allowed"
        );
    }
    Ok(Activated {
        deployment,
        endpoints: record.endpoints,
        changes: record.changes,
    })
}

/// The version a rollback without a target re-activates: the newest deployment (history is
/// newest first) of a version other than the active one.
fn previous_deployment(history: &[(Uuid, String)]) -> Option<String> {
    let (active, _) = history.first()?;
    history
        .iter()
        .find(|(id, _)| id != active)
        .map(|(_, version)| version.clone())
}

/// Where the snapshot of `agent`@`version` sends its secrets, each named by `member` (a bundle
/// member's child name) when given.
fn endpoints_of(
    providers: &dyn ProviderFactory,
    agent: &AgentRef,
    version: &str,
    snapshot_json: &str,
    member: Option<&str>,
) -> Result<Vec<SecretEndpoint>, ActivationError> {
    let compiled = CompiledAgent::from_snapshot_json(snapshot_json.as_bytes()).map_err(|e| {
        ActivationError::BadSnapshot {
            agent: agent.clone(),
            version: version.to_owned(),
            reason: e.to_string(),
        }
    })?;
    Ok(providers
        .secret_destinations(&compiled)
        .into_iter()
        .map(|d| SecretEndpoint {
            member: member.map(str::to_owned),
            secret: d.secret,
            from_env: d.from_env,
            endpoint: d.endpoint,
        })
        .collect())
}

/// The endpoints among `endpoints` that no earlier deployment sent the same variable to.
fn new_endpoints(
    endpoints: &[SecretEndpoint],
    earlier: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<SecretEndpointChange> {
    endpoints
        .iter()
        .filter(|e| {
            earlier
                .get(&e.from_env)
                .is_none_or(|seen| !seen.contains(&e.endpoint))
        })
        .map(|e| SecretEndpointChange {
            member: e.member.clone(),
            secret: e.secret.clone(),
            from_env: e.from_env.clone(),
            endpoint: e.endpoint.clone(),
            previous: earlier
                .get(&e.from_env)
                .map(|seen| seen.iter().cloned().collect())
                .unwrap_or_default(),
        })
        .collect()
}

/// An agent's deployments.
struct AgentForm<'a> {
    ledger: &'a Ledger,
    providers: &'a dyn ProviderFactory,
    agent: &'a AgentRef,
    actor: &'a Attribution,
}

impl Form for AgentForm<'_> {
    type Deployment = Deployment;

    fn subject(&self) -> String {
        format!("agent {}", self.agent)
    }

    fn actor(&self) -> &Attribution {
        self.actor
    }

    async fn history(&self) -> Result<Vec<(Uuid, String)>, ActivationError> {
        let rows = self.ledger.list_deployments(self.agent).await?;
        Ok(rows
            .into_iter()
            .map(|d| (d.version_id, d.version))
            .collect())
    }

    async fn target(&self, version: &str) -> Result<Target, ActivationError> {
        let stored = self.ledger.get_agent_version(self.agent, version).await?;
        Ok(Target {
            endpoints: self.version_endpoints(&stored)?,
            version: stored.version,
        })
    }

    async fn endpoints_by_id(&self, id: Uuid) -> Result<Vec<SecretEndpoint>, ActivationError> {
        let stored = self.ledger.get_agent_version_by_id(id).await?;
        self.version_endpoints(&stored)
    }

    fn refusal(&self, version: String, changes: Vec<SecretEndpointChange>) -> ActivationError {
        ActivationError::NewSecretEndpoints {
            agent: self.agent.clone(),
            version,
            changes,
        }
    }

    async fn record_refusal(
        &self,
        version: &str,
        action: DeploymentAction,
        changes: &[SecretEndpointChange],
    ) -> Result<(), LedgerError> {
        self.ledger
            .record_activation_refused(self.agent, version, action, changes, self.actor)
            .await
    }

    async fn activate(
        &self,
        action: DeploymentAction,
        version: &str,
        record: &SecretEndpointRecord,
    ) -> Result<Deployment, LedgerError> {
        let (ledger, agent, actor) = (self.ledger, self.agent, self.actor);
        match action {
            DeploymentAction::Deploy => {
                ledger
                    .deploy_recording(agent, version, actor, Some(record))
                    .await
            }
            DeploymentAction::Rollback => {
                ledger
                    .rollback_recording(agent, version, actor, record)
                    .await
            }
        }
    }

    async fn rollback_without_previous(&self) -> Result<Deployment, LedgerError> {
        self.ledger.rollback(self.agent, None, self.actor).await
    }
}

impl AgentForm<'_> {
    fn version_endpoints(
        &self,
        stored: &AgentVersion,
    ) -> Result<Vec<SecretEndpoint>, ActivationError> {
        endpoints_of(
            self.providers,
            self.agent,
            &stored.version,
            &stored.snapshot_json,
            None,
        )
    }
}

/// A bundle's deployments; each version's destinations are its members'.
struct BundleForm<'a> {
    ledger: &'a Ledger,
    providers: &'a dyn ProviderFactory,
    bundle: &'a BundleRef,
    actor: &'a Attribution,
}

impl BundleForm<'_> {
    fn members_endpoints(
        &self,
        members: &[BundleMember],
    ) -> Result<Vec<SecretEndpoint>, ActivationError> {
        let mut endpoints = Vec::new();
        for m in members {
            let agent = AgentRef::new(&m.agent.namespace, &m.agent.name);
            endpoints.extend(endpoints_of(
                self.providers,
                &agent,
                &m.agent.version,
                &m.snapshot_json,
                Some(&m.child_name),
            )?);
        }
        Ok(endpoints)
    }
}

impl Form for BundleForm<'_> {
    type Deployment = BundleDeployment;

    fn subject(&self) -> String {
        format!("bundle {}", self.bundle)
    }

    fn actor(&self) -> &Attribution {
        self.actor
    }

    async fn history(&self) -> Result<Vec<(Uuid, String)>, ActivationError> {
        let rows = self.ledger.list_bundle_deployments(self.bundle).await?;
        Ok(rows
            .into_iter()
            .map(|d| (d.version_id, d.version))
            .collect())
    }

    async fn target(&self, version: &str) -> Result<Target, ActivationError> {
        let (found, members, _) = self
            .ledger
            .get_bundle_version(self.bundle, Some(version))
            .await?;
        Ok(Target {
            endpoints: self.members_endpoints(&members)?,
            version: found.version,
        })
    }

    async fn endpoints_by_id(&self, id: Uuid) -> Result<Vec<SecretEndpoint>, ActivationError> {
        let members = self.ledger.list_bundle_members(id).await?;
        self.members_endpoints(&members)
    }

    fn refusal(&self, version: String, changes: Vec<SecretEndpointChange>) -> ActivationError {
        ActivationError::BundleNewSecretEndpoints {
            bundle: self.bundle.clone(),
            version,
            changes,
        }
    }

    async fn record_refusal(
        &self,
        version: &str,
        action: DeploymentAction,
        changes: &[SecretEndpointChange],
    ) -> Result<(), LedgerError> {
        self.ledger
            .record_bundle_activation_refused(self.bundle, version, action, changes, self.actor)
            .await
    }

    async fn activate(
        &self,
        action: DeploymentAction,
        version: &str,
        record: &SecretEndpointRecord,
    ) -> Result<BundleDeployment, LedgerError> {
        let (ledger, bundle, actor) = (self.ledger, self.bundle, self.actor);
        match action {
            DeploymentAction::Deploy => {
                ledger
                    .deploy_bundle_recording(bundle, version, actor, Some(record))
                    .await
            }
            DeploymentAction::Rollback => {
                ledger
                    .rollback_bundle_recording(bundle, version, actor, record)
                    .await
            }
        }
    }

    async fn rollback_without_previous(&self) -> Result<BundleDeployment, LedgerError> {
        self.ledger
            .rollback_bundle(self.bundle, None, self.actor)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(secret: &str, var: &str, url: &str) -> SecretEndpoint {
        SecretEndpoint {
            member: None,
            secret: secret.into(),
            from_env: var.into(),
            endpoint: url.into(),
        }
    }

    #[test]
    fn only_a_variable_sent_somewhere_new_is_a_change() {
        let mut earlier: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        earlier
            .entry("OPENAI_API_KEY".into())
            .or_default()
            .insert("http://a/v1".into());
        // Renaming the secret while the same value goes to the same place changes nothing.
        assert!(
            new_endpoints(
                &[endpoint("key", "OPENAI_API_KEY", "http://a/v1")],
                &earlier
            )
            .is_empty()
        );
        let changes = new_endpoints(
            &[
                endpoint("openai", "OPENAI_API_KEY", "http://b/v1"),
                endpoint("crm", "CRM_TOKEN", "http://a/v1"),
            ],
            &earlier,
        );
        assert_eq!(
            changes.iter().map(describe_change).collect::<Vec<_>>(),
            [
                "secret \"openai\" (OPENAI_API_KEY) is now sent to http://b/v1 (previous deployments: http://a/v1)",
                "secret \"crm\" (CRM_TOKEN) is now sent to http://a/v1 (no earlier deployment sent CRM_TOKEN)",
            ]
        );
    }

    #[test]
    fn a_bundle_refusal_names_the_bundle_each_member_and_the_way_forward() {
        let earlier: BTreeMap<String, BTreeSet<String>> = [(
            "OPENAI_API_KEY".to_owned(),
            ["http://a/v1".to_owned()].into(),
        )]
        .into();
        let mut sent = endpoint("openai", "OPENAI_API_KEY", "http://b/v1");
        sent.member = Some("refund-specialist".into());
        let mut same = endpoint("openai", "OPENAI_API_KEY", "http://a/v1");
        same.member = Some("front-desk".into());
        // Keyed per variable across members: the front desk's A was deployed before.
        let changes = new_endpoints(&[same, sent], &earlier);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].member.as_deref(), Some("refund-specialist"));
        let refused = ActivationError::BundleNewSecretEndpoints {
            bundle: BundleRef::new("support", "refund-desk"),
            version: "1.1.0".into(),
            changes,
        };
        assert_eq!(
            refused.to_string(),
            "bundle support/refund-desk@1.1.0 sends secrets to endpoints no earlier deployment \
             of bundle support/refund-desk used: member \"refund-specialist\": secret \"openai\" \
             (OPENAI_API_KEY) is now sent to http://b/v1 (previous deployments: http://a/v1); \
             check that these endpoints are meant to receive them, then repeat with \
             allow_new_secret_endpoints (phrony bundles deploy/rollback \
             --allow-new-secret-endpoints)"
        );
    }

    #[test]
    fn a_rollback_without_a_target_goes_to_the_newest_other_version() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let row = |id: Uuid, v: &str| (id, v.to_owned());
        assert_eq!(previous_deployment(&[]), None);
        assert_eq!(previous_deployment(&[row(a, "1"), row(a, "1")]), None);
        assert_eq!(
            previous_deployment(&[row(b, "2"), row(b, "2"), row(a, "1"), row(b, "2")]),
            Some("1".to_owned())
        );
    }
}
