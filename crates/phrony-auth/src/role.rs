//! Roles a credential carries and the permissions each grants.
//!
//! | role        | permissions                                                            |
//! |-------------|------------------------------------------------------------------------|
//! | `viewer`    | [`Permission::Read`]                                                   |
//! | `runner`    | `Read`, [`Permission::Run`] (start, attach to, cancel, complete sessions) |
//! | `approver`  | `Read`, [`Permission::Approve`] (restricted to the credential's routes) |
//! | `publisher` | `Read`, [`Permission::Publish`] (publish, deploy, rollback, deprecate, retire, archive) |
//! | `worker`    | [`Permission::Work`] (the Work stream, for the credential's tools)     |
//! | `relay`     | [`Permission::Relay`] (record another actor, with this principal as `via`) |
//! | `admin`     | every permission, including [`Permission::ManageTokens`] and [`Permission::Operate`] (re-queue failed webhook deliveries) |

use std::fmt;
use std::str::FromStr;

/// What an RPC needs; a [`Role`] grants a fixed set of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// Read agents, versions, deployments, sessions, approvals and the audit trail.
    Read,
    /// Start, attach to, cancel and complete sessions.
    Run,
    /// Vote on approvals (on the credential's routes, when it lists any).
    Approve,
    /// Publish, deploy, roll back, deprecate, retire and archive agents and bundles.
    Publish,
    /// Open the Work stream and register handlers for the credential's tools.
    Work,
    /// Name another actor on a request; both are recorded (`actor` and `via`).
    Relay,
    /// Create, list and revoke API tokens.
    ManageTokens,
    /// Operate the runtime's delivery machinery: re-queue failed webhook deliveries.
    Operate,
}

impl Permission {
    /// Every permission, in a fixed order.
    pub const ALL: [Self; 8] = [
        Self::Read,
        Self::Run,
        Self::Approve,
        Self::Publish,
        Self::Work,
        Self::Relay,
        Self::ManageTokens,
        Self::Operate,
    ];

    /// The permission's name, as error messages print it (`approve`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Run => "run",
            Self::Approve => "approve",
            Self::Publish => "publish",
            Self::Work => "work",
            Self::Relay => "relay",
            Self::ManageTokens => "manage-tokens",
            Self::Operate => "operate",
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named bundle of permissions carried by a credential (see the module docs for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Read only.
    Viewer,
    /// Runs sessions.
    Runner,
    /// Decides approvals.
    Approver,
    /// Changes what is deployed.
    Publisher,
    /// Serves tool calls.
    Worker,
    /// Acts on behalf of its own users (e.g. an approvals UI).
    Relay,
    /// Everything.
    Admin,
}

impl Role {
    /// Every role, in a fixed order.
    pub const ALL: [Self; 7] = [
        Self::Viewer,
        Self::Runner,
        Self::Approver,
        Self::Publisher,
        Self::Worker,
        Self::Relay,
        Self::Admin,
    ];

    /// The role's name as written on the command line and in configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Runner => "runner",
            Self::Approver => "approver",
            Self::Publisher => "publisher",
            Self::Worker => "worker",
            Self::Relay => "relay",
            Self::Admin => "admin",
        }
    }

    /// The permissions this role grants.
    #[must_use]
    pub fn grants(self) -> &'static [Permission] {
        use Permission as P;
        match self {
            Self::Viewer => &[P::Read],
            Self::Runner => &[P::Read, P::Run],
            Self::Approver => &[P::Read, P::Approve],
            Self::Publisher => &[P::Read, P::Publish],
            Self::Worker => &[P::Work],
            Self::Relay => &[P::Relay],
            Self::Admin => &Permission::ALL,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one of [`Role::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown role {given:?} (roles: viewer, runner, approver, publisher, worker, relay, admin)"
)]
pub struct UnknownRole {
    /// The name given.
    pub given: String,
}

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRole {
                given: s.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn roles_round_trip_through_their_names_and_unknown_ones_are_listed() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        let err = "root".parse::<Role>().unwrap_err();
        assert!(err.to_string().contains("\"root\""), "{err}");
        assert!(err.to_string().contains("approver"), "{err}");
    }

    #[test]
    fn only_admin_manages_tokens_and_only_worker_and_admin_work() {
        for role in Role::ALL {
            assert_eq!(
                role.grants().contains(&Permission::ManageTokens),
                role == Role::Admin,
                "{role}"
            );
            assert_eq!(
                role.grants().contains(&Permission::Work),
                matches!(role, Role::Worker | Role::Admin),
                "{role}"
            );
        }
        assert!(!Role::Viewer.grants().contains(&Permission::Approve));
        assert!(!Role::Runner.grants().contains(&Permission::Approve));
        assert!(!Role::Approver.grants().contains(&Permission::Publish));
    }
}
