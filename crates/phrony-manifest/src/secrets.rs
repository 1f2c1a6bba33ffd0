//! Secret requirements: the `fromEnv` references a client resolves at run time (§1.13, §7).

use std::collections::BTreeMap;

use crate::model::compiled::CompiledAgent;

/// One secret the agent needs: its name and the environment variable holding its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRequirement {
    /// Secret name (`secrets.<name>`).
    pub name: String,
    /// Environment variable the client reads.
    pub from_env: String,
}

impl SecretRequirement {
    /// Whether the variable is unset or empty in the environment `lookup` reads (the CLI passes
    /// the process environment; the run-time client refuses both).
    pub fn is_missing_from_env(
        &self,
        lookup: impl FnOnce(&str) -> Option<std::ffi::OsString>,
    ) -> bool {
        lookup(&self.from_env).is_none_or(|v| v.is_empty())
    }

    /// `secret "openai": OPENAI_API_KEY is not set in the local environment` (the CLI prefixes
    /// `warning: `).
    pub fn unset_message(&self) -> String {
        format!(
            "secret {:?}: {} is not set in the local environment",
            self.name, self.from_env
        )
    }
}

impl CompiledAgent {
    /// The secrets this agent needs, sorted by name.
    pub fn secret_requirements(&self) -> Vec<SecretRequirement> {
        self.secrets
            .iter()
            .map(|(name, s)| SecretRequirement {
                name: name.clone(),
                from_env: s.from_env.clone(),
            })
            .collect()
    }
}

/// A secret of a bundle's union: one name, one variable, declared by one or more members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSecret {
    /// Secret name.
    pub name: String,
    /// Environment variable.
    pub from_env: String,
    /// Child names of the members declaring it, in closure order.
    pub declared_by: Vec<String>,
}

/// Builds the union of members' secrets. Two members giving one name different variables is a
/// conflict: `secret "openai": member "a" uses X, member "b" uses Y`.
pub fn secret_union<'a>(
    members: impl IntoIterator<Item = (&'a str, &'a CompiledAgent)>,
) -> Result<Vec<BundleSecret>, Vec<String>> {
    let mut union: BTreeMap<String, BundleSecret> = BTreeMap::new();
    let mut conflicts = Vec::new();
    for (child, agent) in members {
        for req in agent.secret_requirements() {
            match union.get_mut(&req.name) {
                None => {
                    union.insert(
                        req.name.clone(),
                        BundleSecret {
                            name: req.name,
                            from_env: req.from_env,
                            declared_by: vec![child.to_owned()],
                        },
                    );
                }
                Some(s) if s.from_env == req.from_env => s.declared_by.push(child.to_owned()),
                Some(s) => conflicts.push(format!(
                    "secret {:?}: member {:?} uses {}, member {:?} uses {}",
                    req.name, s.declared_by[0], s.from_env, child, req.from_env
                )),
            }
        }
    }
    if conflicts.is_empty() {
        Ok(union.into_values().collect())
    } else {
        Err(conflicts)
    }
}
