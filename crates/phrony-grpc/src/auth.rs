//! The principal of a request, as the edge's authentication left it in the request extensions.

use phrony_auth::Principal;
use tonic::Request;

/// The authenticated principal of `request` (put into its extensions by the edge), or — when
/// no edge ran (handlers called directly, `local` mode before authentication is wired) —
/// [`Principal::unverified`] under `default_actor`.
pub(crate) fn principal<T>(request: &Request<T>, default_actor: &str) -> Principal {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(|| Principal::unverified(default_actor))
}
