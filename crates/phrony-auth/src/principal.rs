//! Principals (who the runtime verified a caller to be), what they may do, and how an event
//! attributes a change to them.

use std::collections::BTreeSet;
use std::fmt;

use crate::role::{Permission, Role};

/// How the runtime established who a caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verification {
    /// Nobody verified it: `local` mode takes the name the client gives.
    Unverified,
    /// An API token from the runtime's token store.
    Token,
    /// A JWT from the configured OIDC issuer.
    Oidc,
    /// The subject of a client certificate signed by the configured CA.
    Mtls,
}

impl Verification {
    /// The name stored with each event and printed by `inspect` (`token`, `oidc`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unverified => "unverified",
            Self::Token => "token",
            Self::Oidc => "oidc",
            Self::Mtls => "mtls",
        }
    }

    /// The inverse of [`Verification::as_str`].
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Unverified, Self::Token, Self::Oidc, Self::Mtls]
            .into_iter()
            .find(|v| v.as_str() == s)
    }

    /// Whether somebody checked the identity (every variant but [`Verification::Unverified`]).
    #[must_use]
    pub fn is_verified(self) -> bool {
        self != Self::Unverified
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which `tool@version`s a worker credential may serve: `payments.issue-refund@1.0.0`,
/// `payments.*@1.*`, `payments.*` (any version) or `*` (everything). `*` matches any run of
/// characters, including none; everything else matches itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolPattern {
    tool: String,
    version: String,
}

/// A `--tool` pattern that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tool pattern {given:?} is invalid: {problem} (expected TOOL[@VERSION], `*` as a wildcard)"
)]
pub struct BadToolPattern {
    /// The pattern given.
    pub given: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl ToolPattern {
    /// Parses `TOOL[@VERSION]`; a missing version means any version.
    ///
    /// # Errors
    /// An empty tool or version, more than one `@`, or whitespace.
    pub fn parse(given: &str) -> Result<Self, BadToolPattern> {
        let bad = |problem| BadToolPattern {
            given: given.to_owned(),
            problem,
        };
        if given.chars().any(char::is_whitespace) {
            return Err(bad("it contains whitespace"));
        }
        let (tool, version) = match given.split_once('@') {
            Some((t, v)) => (t, v),
            None => (given, "*"),
        };
        if tool.is_empty() {
            return Err(bad("the tool is empty"));
        }
        if version.is_empty() {
            return Err(bad("the version is empty"));
        }
        if version.contains('@') {
            return Err(bad("it has more than one `@`"));
        }
        Ok(Self {
            tool: tool.to_owned(),
            version: version.to_owned(),
        })
    }

    /// Whether `tool@version` matches.
    #[must_use]
    pub fn matches(&self, tool: &str, version: &str) -> bool {
        glob(&self.tool, tool) && glob(&self.version, version)
    }
}

impl fmt::Display for ToolPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.tool, self.version)
    }
}

/// `*`-only glob matching (iterative, linear in practice; no backtracking blow-up because each
/// `*` only remembers the latest star position).
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// A caller the runtime has identified: the name it records, how it knows, and what the
/// credential allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The recorded name (a token's name, a JWT's subject, a certificate's subject, or in
    /// `local` mode the name the client gave).
    pub name: String,
    /// How the name was established.
    pub verification: Verification,
    /// The credential's roles.
    pub roles: BTreeSet<Role>,
    /// The approval routes an approver may vote on; empty means every route.
    pub routes: Vec<String>,
    /// The tools a worker may serve; empty means none (unless the principal is an admin).
    pub tools: Vec<ToolPattern>,
}

/// A permission the principal does not have; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal:?} lacks the {permission} permission (roles: {roles})")]
pub struct Denied {
    /// The principal's name.
    pub principal: String,
    /// The missing permission.
    pub permission: Permission,
    /// The principal's roles, comma-separated (`none` when it has none).
    pub roles: String,
}

/// A request naming an actor other than its verified principal, without [`Permission::Relay`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{principal:?} may not act as {claimed:?}: the recorded actor is the authenticated principal \
     (acting for others needs the relay permission)"
)]
pub struct Impersonation {
    /// The verified principal.
    pub principal: String,
    /// The actor the request named.
    pub claimed: String,
}

impl Principal {
    /// The caller of `local` mode: nobody verified `name`, and every permission is granted (the
    /// zero-set-up tutorial behaves exactly as an unauthenticated runtime always did).
    #[must_use]
    pub fn unverified(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            verification: Verification::Unverified,
            roles: BTreeSet::from([Role::Admin]),
            routes: Vec::new(),
            tools: Vec::new(),
        }
    }

    /// Whether any of the principal's roles grants `permission`.
    #[must_use]
    pub fn permits(&self, permission: Permission) -> bool {
        self.roles.iter().any(|r| r.grants().contains(&permission))
    }

    /// [`Principal::permits`], as an error naming the missing permission.
    ///
    /// # Errors
    /// [`Denied`] when no role grants `permission`.
    pub fn require(&self, permission: Permission) -> Result<(), Denied> {
        if self.permits(permission) {
            return Ok(());
        }
        let roles: Vec<&str> = self.roles.iter().map(|r| r.as_str()).collect();
        Err(Denied {
            principal: self.name.clone(),
            permission,
            roles: if roles.is_empty() {
                "none".to_owned()
            } else {
                roles.join(", ")
            },
        })
    }

    /// Whether the principal may vote on an approval routed to `route` (`None`: the policy
    /// names no approver role): it needs [`Permission::Approve`], and when its credential lists
    /// routes, the approval's route must be one of them (an admin may vote anywhere).
    #[must_use]
    pub fn may_approve_route(&self, route: Option<&str>) -> bool {
        if !self.permits(Permission::Approve) {
            return false;
        }
        if self.roles.contains(&Role::Admin) || self.routes.is_empty() {
            return true;
        }
        route.is_some_and(|r| self.routes.iter().any(|allowed| allowed == r))
    }

    /// The routes a vote by this principal is restricted to, as the vote rules take them: empty
    /// for any route (no listed routes, or an admin), else the credential's routes.
    #[must_use]
    pub fn route_restriction(&self) -> Vec<String> {
        if self.roles.contains(&Role::Admin) {
            Vec::new()
        } else {
            self.routes.clone()
        }
    }

    /// Whether the principal may serve `tool@version` on the Work stream: it needs
    /// [`Permission::Work`] and a matching tool pattern (an admin serves anything).
    #[must_use]
    pub fn may_serve(&self, tool: &str, version: &str) -> bool {
        self.permits(Permission::Work)
            && (self.roles.contains(&Role::Admin)
                || self.tools.iter().any(|p| p.matches(tool, version)))
    }

    /// Who a change made by this principal is recorded as, given the actor the request named
    /// (its `actor` field or `phrony-actor` header; `None` when it named none).
    ///
    /// - An unverified principal (`local` mode) is recorded under the name it gave, marked
    ///   unverified.
    /// - A verified principal naming nobody, or itself (case-insensitively), is recorded as
    ///   itself.
    /// - A verified principal naming someone else needs [`Permission::Relay`]; the change is then
    ///   recorded as the named actor `via` the principal.
    ///
    /// # Errors
    /// [`Impersonation`] when a verified principal without the relay permission names someone
    /// else.
    pub fn attribute(&self, claimed: Option<&str>) -> Result<Attribution, Impersonation> {
        let claimed = claimed.filter(|c| !c.is_empty());
        if self.verification == Verification::Unverified {
            return Ok(Attribution {
                actor: claimed.unwrap_or(&self.name).to_owned(),
                verification: Verification::Unverified,
                via: None,
            });
        }
        match claimed {
            None => Ok(self.as_attribution()),
            Some(c) if c.to_lowercase() == self.name.to_lowercase() => Ok(self.as_attribution()),
            Some(c) if self.permits(Permission::Relay) => Ok(Attribution {
                actor: c.to_owned(),
                verification: self.verification,
                via: Some(self.name.clone()),
            }),
            Some(c) => Err(Impersonation {
                principal: self.name.clone(),
                claimed: c.to_owned(),
            }),
        }
    }

    fn as_attribution(&self) -> Attribution {
        Attribution {
            actor: self.name.clone(),
            verification: self.verification,
            via: None,
        }
    }
}

/// Who an event is attributed to: the actor, how the runtime knows, and the relaying principal
/// when one acted on the actor's behalf. Displayed as `emad`, `emad (unverified)` or
/// `alice via approvals-ui`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attribution {
    /// The recorded actor.
    pub actor: String,
    /// How the runtime established it (for a relayed actor: how it established the relay).
    pub verification: Verification,
    /// The principal that relayed the actor, if any.
    pub via: Option<String>,
}

impl Attribution {
    /// An attribution nobody verified (`local` mode, and the runtime's own actors).
    #[must_use]
    pub fn unverified(actor: impl Into<String>) -> Self {
        Self {
            actor: actor.into(),
            verification: Verification::Unverified,
            via: None,
        }
    }

    /// Whether the actor itself was verified: verified, and not relayed.
    #[must_use]
    pub fn is_verified_actor(&self) -> bool {
        self.verification.is_verified() && self.via.is_none()
    }
}

/// A bare name is an attribution nobody verified ([`Attribution::unverified`]): a name given
/// without a credential never claims more than that.
impl From<&str> for Attribution {
    fn from(actor: &str) -> Self {
        Self::unverified(actor)
    }
}

/// As `From<&str>`.
impl From<String> for Attribution {
    fn from(actor: String) -> Self {
        Self::unverified(actor)
    }
}

/// A copy, so that APIs taking `impl Into<Attribution>` accept a borrowed one.
impl From<&Attribution> for Attribution {
    fn from(actor: &Attribution) -> Self {
        actor.clone()
    }
}

impl fmt::Display for Attribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.actor)?;
        if let Some(via) = &self.via {
            write!(f, " via {via}")?;
        }
        if !self.verification.is_verified() {
            f.write_str(" (unverified)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn principal(roles: &[Role]) -> Principal {
        Principal {
            name: "ops-bot".into(),
            verification: Verification::Token,
            roles: roles.iter().copied().collect(),
            routes: Vec::new(),
            tools: Vec::new(),
        }
    }

    #[test]
    fn tool_patterns_match_tool_and_version_with_wildcards() {
        let p = ToolPattern::parse("payments.*@1.*").unwrap();
        assert!(p.matches("payments.issue-refund", "1.0.0"));
        assert!(!p.matches("payments.issue-refund", "2.0.0"));
        assert!(!p.matches("crm.lookup", "1.0.0"));
        let exact = ToolPattern::parse("payments.issue-refund@1.0.0").unwrap();
        assert!(exact.matches("payments.issue-refund", "1.0.0"));
        assert!(!exact.matches("payments.issue-refund", "1.0.1"));
        assert!(!exact.matches("payments.issue-refundX", "1.0.0"));
        assert!(ToolPattern::parse("*").unwrap().matches("a", "b"));
        assert!(ToolPattern::parse("crm.*").unwrap().matches("crm.x", "9"));
        for bad in ["", "@1", "a@", "a@b@c", "a b"] {
            assert!(ToolPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        assert!(glob("**", ""));
    }

    #[test]
    fn a_missing_permission_is_named() {
        let viewer = principal(&[Role::Viewer]);
        assert!(viewer.require(Permission::Read).is_ok());
        let err = viewer.require(Permission::Publish).unwrap_err();
        assert_eq!(err.permission, Permission::Publish);
        assert!(err.to_string().contains("publish permission"), "{err}");
        assert!(
            principal(&[])
                .require(Permission::Read)
                .unwrap_err()
                .to_string()
                .contains("none")
        );
    }

    #[test]
    fn approvers_are_held_to_their_routes() {
        let mut a = principal(&[Role::Approver]);
        assert!(a.may_approve_route(Some("finance")));
        assert!(a.may_approve_route(None));
        a.routes = vec!["finance".into()];
        assert!(a.may_approve_route(Some("finance")));
        assert!(!a.may_approve_route(Some("legal")));
        assert!(!a.may_approve_route(None));
        assert!(!principal(&[Role::Runner]).may_approve_route(None));
    }

    #[test]
    fn workers_serve_only_their_tools() {
        let mut w = principal(&[Role::Worker]);
        assert!(!w.may_serve("payments.issue-refund", "1.0.0"));
        w.tools = vec![ToolPattern::parse("payments.issue-refund@1.0.0").unwrap()];
        assert!(w.may_serve("payments.issue-refund", "1.0.0"));
        assert!(!w.may_serve("payments.issue-refund", "1.1.0"));
        assert!(!principal(&[Role::Runner]).may_serve("x", "1"));
        assert!(principal(&[Role::Admin]).may_serve("x", "1"));
    }

    #[test]
    fn the_recorded_actor_is_the_principal_unless_it_relays() {
        let p = principal(&[Role::Approver]);
        assert_eq!(p.attribute(None).unwrap().to_string(), "ops-bot");
        assert_eq!(p.attribute(Some("OPS-bot")).unwrap().actor, "ops-bot");
        let err = p.attribute(Some("ciso")).unwrap_err();
        assert!(err.to_string().contains("relay permission"), "{err}");
        let relay = principal(&[Role::Relay]);
        let a = relay.attribute(Some("alice")).unwrap();
        assert_eq!(a.to_string(), "alice via ops-bot");
        assert!(!a.is_verified_actor());
        let local = Principal::unverified("default");
        let a = local.attribute(Some("emad")).unwrap();
        assert_eq!(a.to_string(), "emad (unverified)");
        assert_eq!(local.attribute(None).unwrap().actor, "default");
        assert!(local.permits(Permission::ManageTokens));
    }
}
