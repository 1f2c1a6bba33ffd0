//! The access edge: for every RPC of `phrony.runtime.v1.Runtime`, one place that reads the
//! credentials, authenticates them, checks the RPC's permission and hands the
//! [`Principal`] to the handler.
//!
//! [`Authenticated`] wraps the generated server (`RuntimeServer`) as a tower service, so no
//! handler can be reached without passing through it; health and reflection are separate
//! services and are not wrapped. For each request it:
//!
//! 1. extracts [`Credentials`]: the `authorization` header must be `Bearer <token>` when
//!    present (any other scheme, an empty token or a non-ASCII value is `UNAUTHENTICATED`
//!    naming the problem);
//! 2. asks the [`Authenticator`] (in `local` mode `phrony_auth::Unauthenticated`, which admits
//!    everyone as an unverified admin): a missing, unknown, expired, revoked or rejected
//!    credential is `UNAUTHENTICATED` with the authenticator's reason; a store that cannot be
//!    reached is `UNAVAILABLE`;
//! 3. looks the RPC up in [`PERMISSIONS`] (every RPC of the service has exactly one row; the
//!    test `every_rpc_of_the_service_has_exactly_one_permission_row` reads the service
//!    descriptor and fails otherwise) and checks it with [`Principal::require`]: a missing
//!    permission is `PERMISSION_DENIED` with the [`phrony_auth::Denied`] message, which names
//!    it. A method the table does not know is `UNIMPLEMENTED`;
//! 4. inserts the principal into the request's extensions, where handlers read it with
//!    [`principal`].
//!
//! Streaming RPCs (`RunSessionInteractive`, `Work`) are authenticated once, when the stream
//! opens. The interactive stream's approval messages additionally need
//! [`Permission::Approve`], checked per message by the stream itself.

use std::convert::Infallible;
use std::sync::Arc;

use phrony_auth::{AuthError, Authenticator, Credentials, Permission, Principal};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{Body as _, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::{Request, Status};

/// The service whose RPCs [`PERMISSIONS`] lists.
pub const RUNTIME_SERVICE: &str = "phrony.runtime.v1.Runtime";

/// What each RPC of `phrony.runtime.v1.Runtime` needs. `viewer` reads, `runner` runs sessions,
/// `approver` decides, `publisher` changes what is deployed, `worker` serves tool calls (see
/// `phrony_auth::Role` for which role grants which permission).
pub const PERMISSIONS: &[(&str, Permission)] = &[
    // Reads.
    ("GetVersion", Permission::Read),
    ("GetActiveVersion", Permission::Read),
    ("ListDeployments", Permission::Read),
    ("GetAgentVersion", Permission::Read),
    ("ListAgents", Permission::Read),
    ("ListAgentVersions", Permission::Read),
    ("ListSessions", Permission::Read),
    ("InspectSession", Permission::Read),
    ("GetSessionPayload", Permission::Read),
    ("GetApproval", Permission::Read),
    ("ListApprovals", Permission::Read),
    ("WatchApprovals", Permission::Read),
    ("GetActiveBundle", Permission::Read),
    ("GetBundleSecretRequirements", Permission::Read),
    ("ListBundles", Permission::Read),
    ("ListBundleVersions", Permission::Read),
    ("ListBundleDeployments", Permission::Read),
    ("GetBundleVersion", Permission::Read),
    // The audit trail: verifying the chains and exporting the events are reads.
    ("VerifyAudit", Permission::Read),
    ("ExportAudit", Permission::Read),
    // What shadow policies would have changed: a read of the audit trail.
    ("ListShadowDecisions", Permission::Read),
    // Webhook deliveries: listing is a read; re-queueing a failed one operates the runtime.
    ("ListWebhookDeliveries", Permission::Read),
    ("RetryWebhookDelivery", Permission::Operate),
    // Sessions.
    ("RunSession", Permission::Run),
    ("RunSessionInteractive", Permission::Run),
    ("CancelSession", Permission::Run),
    ("CompleteSession", Permission::Run),
    // Approvals.
    ("DecideApproval", Permission::Approve),
    // What is deployed.
    ("Publish", Permission::Publish),
    ("PublishBundle", Permission::Publish),
    ("Deploy", Permission::Publish),
    ("DeployBundle", Permission::Publish),
    ("RollbackBundle", Permission::Publish),
    ("Rollback", Permission::Publish),
    ("DeprecateAgentVersion", Permission::Publish),
    ("RetireAgentVersion", Permission::Publish),
    ("ArchiveAgent", Permission::Publish),
    // Tool workers.
    ("Work", Permission::Work),
];

/// The permission `method` (the RPC's name, e.g. `DecideApproval`) needs, if it is an RPC of
/// the service.
#[must_use]
pub fn permission_for(method: &str) -> Option<Permission> {
    PERMISSIONS
        .iter()
        .find(|(name, _)| *name == method)
        .map(|(_, p)| *p)
}

/// The principal the edge put on `request`, or, for a handler called without the edge (unit
/// tests), an unverified principal named `default_actor`.
pub(crate) fn principal<T>(request: &Request<T>, default_actor: &str) -> Principal {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(|| Principal::unverified(default_actor))
}

/// Reads the bearer token of an `authorization` header value.
///
/// # Errors
/// `UNAUTHENTICATED` naming the problem: not ASCII, not the `Bearer` scheme, or no token.
fn bearer(value: &http::HeaderValue) -> Result<&str, Status> {
    let text = value.to_str().map_err(|_| {
        Status::unauthenticated(
            "malformed credential: the authorization header is not visible ASCII",
        )
    })?;
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Status::unauthenticated(format!(
            "malformed credential: the authorization scheme must be Bearer (got {:?}); send \
             `authorization: Bearer <token>`",
            scheme.chars().take(32).collect::<String>()
        )));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(Status::unauthenticated(
            "malformed credential: the Bearer authorization carries no token",
        ));
    }
    Ok(token)
}

/// The status an authentication failure answers with.
fn auth_status(error: &AuthError) -> Status {
    match error {
        AuthError::Unavailable { .. } => Status::unavailable(error.to_string()),
        _ => Status::unauthenticated(error.to_string()),
    }
}

/// Authenticates and authorizes one request to `path` (`/<service>/<method>`): the
/// principal to hand to the handler, or the status to answer with.
///
/// # Errors
/// As the module docs list.
pub async fn admit(
    authenticator: &dyn Authenticator,
    path: &str,
    headers: &http::HeaderMap,
    peer_subject: Option<&str>,
) -> Result<Principal, Status> {
    let method = path
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(RUNTIME_SERVICE))
        .and_then(|p| p.strip_prefix('/'))
        .unwrap_or(path);
    let token = headers
        .get(http::header::AUTHORIZATION)
        .map(bearer)
        .transpose()?;
    let credentials = Credentials {
        bearer: token,
        peer_subject,
    };
    let principal = authenticator
        .authenticate(credentials)
        .await
        .map_err(|e| auth_status(&e))?;
    let Some(permission) = permission_for(method) else {
        return Err(Status::unimplemented(format!(
            "{path} is not an RPC of this runtime"
        )));
    };
    principal
        .require(permission)
        .map_err(|denied| Status::permission_denied(denied.to_string()))?;
    Ok(principal)
}

/// The generated server `S` behind the access edge (see the module docs).
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    authenticator: Arc<dyn Authenticator>,
}

impl<S> std::fmt::Debug for Authenticated<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticated").finish_non_exhaustive()
    }
}

impl<S> Authenticated<S> {
    /// `inner` (the generated `RuntimeServer`), reachable only through `authenticator` and the
    /// permission table.
    pub fn new(inner: S, authenticator: Arc<dyn Authenticator>) -> Self {
        Self {
            inner,
            authenticator,
        }
    }
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Authenticated<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this call; the fresh clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let authenticator = Arc::clone(&self.authenticator);
        Box::pin(async move {
            let path = request.uri().path().to_owned();
            // Over mutual TLS, the client certificate's subject (already verified against the
            // client CA by the handshake); a certificate without a usable CN is refused here.
            let peer_subject = match crate::peer::extensions_peer_subject(request.extensions()) {
                Ok(subject) => subject,
                Err(e) => return Ok(refuse(auth_status(&e), request).await),
            };
            match admit(
                authenticator.as_ref(),
                &path,
                request.headers(),
                peer_subject.as_deref(),
            )
            .await
            {
                Ok(principal) => {
                    tracing::debug!(rpc = %path, principal = %principal.name, verification = %principal.verification, "rpc admitted");
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(status) => {
                    tracing::info!(rpc = %path, code = ?status.code(), message = status.message(), "rpc refused at the access edge");
                    Ok(refuse(status, request).await)
                }
            }
        })
    }
}

/// How long a refusal waits for the call's first request message, and then how long (and how
/// many request bytes) the rest of the request body is read in the background.
const REFUSAL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
const REFUSAL_DRAIN_BYTES: usize = 64 * 1024;

/// Answers a refused call with `status`, once its first request message has arrived (at most
/// [`REFUSAL_WAIT`]), and keeps reading the request body in the background for at most
/// [`REFUSAL_WAIT`] and [`REFUSAL_DRAIN_BYTES`] instead of dropping it. A client that is still
/// writing its first message when the call ends — the published SDK on a streaming RPC, under
/// load — otherwise sees that write fail and reports `INTERNAL: Internal error from Core`
/// instead of the refusal's status (`tests/python/test_access_sdk.py`).
async fn refuse(status: Status, request: http::Request<Body>) -> http::Response<Body> {
    let mut body = Box::pin(request.into_body());
    let first = tokio::time::timeout(
        REFUSAL_WAIT,
        std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)),
    )
    .await;
    let more = match first {
        // The body ended (or broke): nothing more will be written.
        Ok(None | Some(Err(_))) => false,
        Ok(Some(Ok(_))) | Err(_) => true,
    };
    if more {
        tokio::spawn(async move {
            let drain = async {
                let mut read = 0usize;
                while let Some(Ok(frame)) =
                    std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
                {
                    read = read.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
                    if read > REFUSAL_DRAIN_BYTES {
                        break;
                    }
                }
            };
            // Either way the body is dropped here, which ends the stream.
            let _ = tokio::time::timeout(REFUSAL_WAIT, drain).await;
        });
    }
    status.into_http()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::collections::BTreeSet;

    use phrony_auth::{AuthFuture, Role, Unauthenticated, Verification};
    use prost::Message as _;

    use super::*;

    #[test]
    fn every_rpc_of_the_service_has_exactly_one_permission_row() {
        let set =
            prost_types::FileDescriptorSet::decode(phrony_proto::FILE_DESCRIPTOR_SET).unwrap();
        let service = set
            .file
            .iter()
            .filter(|f| f.package() == "phrony.runtime.v1")
            .flat_map(|f| f.service.iter())
            .find(|s| s.name() == "Runtime")
            .unwrap();
        let rpcs: BTreeSet<&str> = service.method.iter().map(|m| m.name()).collect();
        let rows: Vec<&str> = PERMISSIONS.iter().map(|(name, _)| *name).collect();
        let unique: BTreeSet<&str> = rows.iter().copied().collect();
        assert_eq!(unique.len(), rows.len(), "an RPC has two rows: {rows:?}");
        let missing: Vec<_> = rpcs.difference(&unique).collect();
        assert!(
            missing.is_empty(),
            "RPCs without a permission row: {missing:?}"
        );
        let stale: Vec<_> = unique.difference(&rpcs).collect();
        assert!(
            stale.is_empty(),
            "rows naming no RPC of {RUNTIME_SERVICE}: {stale:?}"
        );
    }

    #[test]
    fn the_table_gives_each_role_its_documented_rpcs() {
        let grants = |role: Role, rpc: &str| role.grants().contains(&permission_for(rpc).unwrap());
        assert!(grants(Role::Viewer, "InspectSession"));
        assert!(grants(Role::Viewer, "GetSessionPayload"));
        assert!(!grants(Role::Viewer, "Publish"));
        assert!(grants(Role::Runner, "RunSessionInteractive"));
        assert!(!grants(Role::Runner, "DecideApproval"));
        assert!(grants(Role::Approver, "DecideApproval"));
        assert!(grants(Role::Publisher, "ArchiveAgent"));
        assert!(!grants(Role::Publisher, "RunSession"));
        assert!(grants(Role::Worker, "Work"));
        assert!(!grants(Role::Worker, "ListSessions"));
    }

    /// Admits `token-of-<role>` as a token principal named `bot` with that role.
    struct ByRole;
    impl Authenticator for ByRole {
        fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> AuthFuture<'a> {
            let result = match credentials.bearer {
                None => Err(AuthError::Missing),
                Some(t) => match t.strip_prefix("token-of-").map(str::parse::<Role>) {
                    Some(Ok(role)) => Ok(Principal {
                        name: "bot".into(),
                        verification: Verification::Token,
                        roles: BTreeSet::from([role]),
                        routes: vec![],
                        tools: vec![],
                    }),
                    Some(Err(_)) | None => Err(AuthError::UnknownToken),
                },
            };
            Box::pin(async move { result })
        }
    }

    fn headers(auth: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[tokio::test]
    async fn credentials_are_read_checked_and_the_permission_is_named() {
        let path = "/phrony.runtime.v1.Runtime/Publish";
        let ok = admit(
            &ByRole,
            path,
            &headers(Some("Bearer token-of-publisher")),
            None,
        )
        .await
        .unwrap();
        assert_eq!(ok.name, "bot");
        let lower = admit(
            &ByRole,
            path,
            &headers(Some("bearer token-of-publisher")),
            None,
        )
        .await;
        assert!(lower.is_ok(), "the scheme is case-insensitive");

        let denied = admit(
            &ByRole,
            path,
            &headers(Some("Bearer token-of-viewer")),
            None,
        )
        .await
        .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(
            denied.message().contains("publish permission"),
            "{denied:?}"
        );

        for (auth, needle) in [
            (None, "no credential"),
            (Some("Basic dXNlcjpwdw=="), "scheme must be Bearer"),
            (Some("Bearer "), "carries no token"),
            (Some("Bearer nope"), "unknown token"),
        ] {
            let status = admit(&ByRole, path, &headers(auth), None)
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{auth:?}");
            assert!(status.message().contains(needle), "{auth:?}: {status:?}");
        }
        let unknown = admit(
            &ByRole,
            "/phrony.runtime.v1.Runtime/Teleport",
            &headers(Some("Bearer token-of-admin")),
            None,
        )
        .await
        .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    }

    #[tokio::test]
    async fn local_mode_admits_everyone_unverified() {
        let local = Unauthenticated {
            default_actor: "anonymous".into(),
        };
        let p = admit(
            &local,
            "/phrony.runtime.v1.Runtime/DecideApproval",
            &headers(None),
            None,
        )
        .await
        .unwrap();
        assert_eq!(p.verification, Verification::Unverified);
        assert_eq!(p.name, "anonymous");
    }
}
