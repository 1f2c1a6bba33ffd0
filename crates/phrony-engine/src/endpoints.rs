//! Secrets follow the deployed versions' endpoints: before a deploy or rollback activates a
//! version, the endpoints it sends its secrets to ([`ProviderFactory::secret_destinations`],
//! under the daemon's current provider configuration) are compared with those of every version
//! the agent has ever had deployed. A secret's value (its `fromEnv` variable) sent to an
//! endpoint no earlier deployment sent it to is refused unless the deployer allows it; the
//! activation event records the endpoints and the allowed changes, and a refusal is recorded
//! as `agent.activation_refused` (who tried, which version, which endpoints).
//!
//! The check reads the history before the ledger's write transaction. History only grows
//! (deployments are append-only, versions immutable), so a concurrent deployment can only turn a
//! refused change into an allowed one later, never let an unseen endpoint through.

use std::collections::{BTreeMap, BTreeSet};

use phrony_ledger::{
    AgentRef, Attribution, Deployment, DeploymentAction, Ledger, LedgerError, SecretEndpoint,
    SecretEndpointChange, SecretEndpointRecord,
};
use phrony_manifest::CompiledAgent;
use uuid::Uuid;

use crate::provider::ProviderFactory;

/// A deploy or a rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation<'a> {
    /// `Deploy` of this version.
    Deploy(&'a str),
    /// `Rollback` to this version, or (`None`) to the newest earlier deployment of another one.
    Rollback(Option<&'a str>),
}

/// A deploy or rollback that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activated {
    /// The deployment row.
    pub deployment: Deployment,
    /// Where the activated version sends its secrets.
    pub endpoints: Vec<SecretEndpoint>,
    /// The secrets it sends to an endpoint no earlier deployment used (allowed by the caller).
    pub changes: Vec<SecretEndpointChange>,
}

/// Why an activation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// The ledger refused or failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The version sends a secret to an endpoint no earlier deployment used, and the caller did
    /// not allow it.
    #[error("{}", refusal(agent, version, changes))]
    NewSecretEndpoints {
        /// The agent.
        agent: AgentRef,
        /// The version that was to be activated.
        version: String,
        /// Each secret and its new endpoint.
        changes: Vec<SecretEndpointChange>,
    },
    /// A stored version is not a snapshot this build can read.
    #[error("stored version {version:?} of agent {agent} is not a readable snapshot: {reason}")]
    BadSnapshot {
        /// The agent.
        agent: AgentRef,
        /// The version.
        version: String,
        /// What is wrong.
        reason: String,
    },
}

/// One sentence per change, and how to proceed.
fn refusal(agent: &AgentRef, version: &str, changes: &[SecretEndpointChange]) -> String {
    let each: Vec<String> = changes.iter().map(describe_change).collect();
    format!(
        "{agent}@{version} sends secrets to endpoints no earlier deployment of {agent} used: {}; \
         check that these endpoints are meant to receive them, then repeat with \
         allow_new_secret_endpoints (phrony agents deploy/rollback --allow-new-secret-endpoints)",
        each.join("; ")
    )
}

/// `secret "openai" (OPENAI_API_KEY) is now sent to B (previous deployments: A)`.
#[must_use]
pub fn describe_change(change: &SecretEndpointChange) -> String {
    let previous = if change.previous.is_empty() {
        format!("no earlier deployment sent {}", change.from_env)
    } else {
        format!("previous deployments: {}", change.previous.join(", "))
    };
    format!(
        "secret {:?} ({}) is now sent to {} ({previous})",
        change.secret, change.from_env, change.endpoint
    )
}

/// Activates a version after checking where it sends its secrets (see the module docs);
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
    let history = ledger.list_deployments(agent).await?;
    let target = match activation {
        Activation::Deploy(version) | Activation::Rollback(Some(version)) => version.to_owned(),
        Activation::Rollback(None) => match previous_deployment(&history) {
            Some(version) => version,
            // The ledger names what is missing (no active, or no previous, deployment).
            None => {
                let deployment = ledger.rollback(agent, None, actor).await?;
                return Ok(Activated {
                    deployment,
                    endpoints: Vec::new(),
                    changes: Vec::new(),
                });
            }
        },
    };
    let stored = ledger.get_agent_version(agent, &target).await?;
    let endpoints = endpoints_of(providers, agent, &target, &stored.snapshot_json)?;
    let earlier = earlier_endpoints(ledger, providers, agent, &history).await?;
    let changes = if history.is_empty() {
        Vec::new()
    } else {
        new_endpoints(&endpoints, &earlier)
    };
    if !changes.is_empty() && !allow_new_endpoints {
        tracing::warn!(
            %agent, version = %target, %actor, changes = ?changes,
            "refused an activation that sends secrets to new endpoints"
        );
        let action = match activation {
            Activation::Deploy(_) => DeploymentAction::Deploy,
            Activation::Rollback(_) => DeploymentAction::Rollback,
        };
        // The refusal stands whether or not it could be recorded: a failed record must not
        // turn a refused activation into an error that hides why it was refused.
        if let Err(e) = ledger
            .record_activation_refused(agent, &target, action, &changes, actor)
            .await
        {
            tracing::error!(%agent, version = %target, error = %e, "could not record a refused activation");
        }
        return Err(ActivationError::NewSecretEndpoints {
            agent: agent.clone(),
            version: target,
            changes,
        });
    }
    let record = SecretEndpointRecord {
        endpoints: endpoints.clone(),
        changes: changes.clone(),
    };
    let deployment = match activation {
        Activation::Deploy(version) => {
            ledger
                .deploy_recording(agent, version, actor, Some(&record))
                .await?
        }
        Activation::Rollback(_) => {
            ledger
                .rollback_recording(agent, &target, actor, &record)
                .await?
        }
    };
    if !changes.is_empty() {
        tracing::warn!(
            %agent, version = %target, %actor, changes = ?changes,
            "activated a version that sends secrets to new endpoints, as the deployer allowed"
        );
    }
    Ok(Activated {
        deployment,
        endpoints,
        changes,
    })
}

/// The version a rollback without a target re-activates: the newest deployment (history is
/// newest first) of a version other than the active one.
fn previous_deployment(history: &[Deployment]) -> Option<String> {
    let active = history.first()?;
    history
        .iter()
        .find(|d| d.version_id != active.version_id)
        .map(|d| d.version.clone())
}

fn endpoints_of(
    providers: &dyn ProviderFactory,
    agent: &AgentRef,
    version: &str,
    snapshot_json: &str,
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
            member: None,
            secret: d.secret,
            from_env: d.from_env,
            endpoint: d.endpoint,
        })
        .collect())
}

/// `fromEnv` variable → the endpoints every version in `history` sends it to.
async fn earlier_endpoints(
    ledger: &Ledger,
    providers: &dyn ProviderFactory,
    agent: &AgentRef,
    history: &[Deployment],
) -> Result<BTreeMap<String, BTreeSet<String>>, ActivationError> {
    let versions: BTreeSet<Uuid> = history.iter().map(|d| d.version_id).collect();
    let mut earlier: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for id in versions {
        let stored = ledger.get_agent_version_by_id(id).await?;
        for e in endpoints_of(providers, agent, &stored.version, &stored.snapshot_json)? {
            earlier.entry(e.from_env).or_default().insert(e.endpoint);
        }
    }
    Ok(earlier)
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
}
