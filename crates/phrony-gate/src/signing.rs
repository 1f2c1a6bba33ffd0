//! Request signatures the SDK sends: the derived HMAC and RFC 9421 with the agent's Ed25519
//! key.
//!
//! - **HMAC** (`X-Agent-Signature: hmac-sha256=<hex>`): the secret is the lower-case hex text
//!   of HMAC-SHA256(key = api key, message = agent id); that 64-character text (as bytes, not
//!   decoded) keys an HMAC-SHA256 over the raw body. `X-Agent-Signature-Timestamp` is not
//!   covered by the MAC; it is only checked for freshness.
//! - **RFC 9421** (`Signature-Input: regent=(…);created=…;keyid="…";alg="ed25519";tag=…`,
//!   `Signature: regent=:<b64>:`, `Content-Digest: sha-256=:<b64>:`): the signature base is
//!   rebuilt from the received request (`@method`, `@authority` from `Host`, `@path` without
//!   the query, covered header fields) and the received `@signature-params`, serialised as
//!   RFC 8941 requires (so parameter order is kept as sent). The body must match
//!   `Content-Digest`.
//!
//! Identical re-sends (same headers, same `created`) are accepted within the skew window: the
//! SDK computes signatures once and reuses them on every retry. Replays are handled by
//! idempotency, not here.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signature, VerifyingKey};
use sfv::{FieldType as _, ListEntry, Parser};
use sha2::{Digest as _, Sha256};

use crate::canonical::hmac_sha256_hex;

/// How a request was authenticated beyond its bearer key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assertion {
    /// The bearer key alone.
    Bearer,
    /// The derived HMAC over the body.
    Hmac,
    /// RFC 9421 with the agent's Ed25519 key.
    Rfc9421 {
        /// The key's RFC 7638 thumbprint.
        kid: String,
    },
    /// No proof at all: a sidecar route, where the caller named an agent (`X-Agent-Id`) that
    /// the sidecar's configuration serves (`routing.sidecar.agents`) and no key or signature was
    /// checked. Recorded as such so that an audit reader never takes it for a verified key.
    Sidecar,
}

impl Assertion {
    /// `assertion_scheme` in tokens and receipts.
    #[must_use]
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::Bearer => "bearer",
            Self::Hmac => "hmac-sha256",
            Self::Rfc9421 { .. } => "rfc9421-ed25519",
            Self::Sidecar => "sidecar-unauthenticated",
        }
    }

    /// `assertion_kid`, when a key signed.
    #[must_use]
    pub fn kid(&self) -> Option<&str> {
        match self {
            Self::Rfc9421 { kid } => Some(kid),
            _ => None,
        }
    }

    /// `key_custody`: who holds the key that proved the request (`none` when no key did).
    #[must_use]
    pub fn custody(&self) -> &'static str {
        match self {
            Self::Rfc9421 { .. } => "agent",
            Self::Bearer | Self::Hmac => "organization",
            Self::Sidecar => "none",
        }
    }
}

/// The parts of a request a signature covers.
#[derive(Clone, Copy)]
pub struct SignedRequest<'a> {
    /// The method, e.g. `POST`.
    pub method: &'a str,
    /// The authority the client used (`Host`), e.g. `127.0.0.1:8009`.
    pub authority: &'a str,
    /// The path without the query.
    pub path: &'a str,
    /// Header lookup by lower-case name (all values, in order).
    pub header: &'a dyn Fn(&str) -> Vec<String>,
    /// The raw body.
    pub body: &'a [u8],
}

impl std::fmt::Debug for SignedRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedRequest")
            .field("method", &self.method)
            .field("authority", &self.authority)
            .field("path", &self.path)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Decodes a base64url (padded or not) Ed25519 public key of 32 bytes.
///
/// # Errors
/// A message naming the problem.
pub fn decode_ed25519_public(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim();
    let raw = URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .or_else(|_| URL_SAFE.decode(text))
        .map_err(|e| format!("not base64url: {e}"))?;
    if raw.len() != 32 {
        return Err(format!(
            "an Ed25519 public key has 32 bytes, got {}",
            raw.len()
        ));
    }
    VerifyingKey::from_bytes(&to_array(&raw)).map_err(|e| format!("not an Ed25519 point: {e}"))?;
    Ok(raw)
}

/// The RFC 7638 thumbprint kid of an Ed25519 key given as base64url text (the SDK's kid).
#[must_use]
pub fn ed25519_kid(public_key_b64url: &str) -> String {
    let x = public_key_b64url.trim().trim_end_matches('=');
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

/// The per-agent HMAC secret: the hex text of HMAC-SHA256(api key, agent id).
#[must_use]
pub fn derive_agent_secret(api_key: &str, agent_id: &str) -> String {
    hmac_sha256_hex(api_key.as_bytes(), agent_id.as_bytes())
}

/// Verifies `X-Agent-Signature: hmac-sha256=<hex>` over `body`.
///
/// # Errors
/// A message naming what does not match.
pub fn verify_hmac(
    api_key: &str,
    agent_id: &str,
    body: &[u8],
    signature_header: &str,
    timestamp_header: Option<&str>,
    now_unix: i64,
    skew_seconds: u32,
) -> Result<(), String> {
    let Some(given) = signature_header.trim().strip_prefix("hmac-sha256=") else {
        return Err("X-Agent-Signature must be `hmac-sha256=<hex>`".into());
    };
    if let Some(ts) = timestamp_header {
        let ts: i64 = ts
            .trim()
            .parse()
            .map_err(|_| "X-Agent-Signature-Timestamp is not unix seconds".to_owned())?;
        if (now_unix - ts).unsigned_abs() > u64::from(skew_seconds) {
            return Err(format!(
                "X-Agent-Signature-Timestamp {ts} is more than {skew_seconds}s away from the gate's clock"
            ));
        }
    }
    let secret = derive_agent_secret(api_key, agent_id);
    let want = hmac_sha256_hex(secret.as_bytes(), body);
    if constant_time_eq(
        want.as_bytes(),
        given.trim().to_ascii_lowercase().as_bytes(),
    ) {
        Ok(())
    } else {
        Err(format!(
            "X-Agent-Signature does not match the body for agent `{agent_id}`"
        ))
    }
}

/// The verified content of an RFC 9421 signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rfc9421 {
    /// The key id the signature names.
    pub kid: String,
}

/// Reads the `keyid` of the `regent` signature without verifying anything.
///
/// # Errors
/// A message when `Signature-Input` is malformed or has no `regent` member.
pub fn rfc9421_keyid(signature_input: &str) -> Result<String, String> {
    let (_, params) = regent_member(signature_input)?;
    string_param(&params, "keyid").ok_or_else(|| "Signature-Input has no keyid".to_owned())
}

/// Verifies the `regent` RFC 9421 signature of `request` with `public_key` (32 raw bytes).
///
/// # Errors
/// A message naming what is wrong (malformed headers, digest mismatch, stale `created`, bad
/// signature).
pub fn verify_rfc9421(
    request: &SignedRequest<'_>,
    public_key: &[u8],
    now_unix: i64,
    skew_seconds: u32,
) -> Result<Rfc9421, String> {
    let input = single(request, "signature-input")?;
    let signature_header = single(request, "signature")?;
    let (inner, params) = regent_member(&input)?;
    let kid = string_param(&params, "keyid").ok_or("Signature-Input has no keyid")?;
    if let Some(alg) = string_param(&params, "alg")
        && alg != "ed25519"
    {
        return Err(format!("signature alg `{alg}` is not ed25519"));
    }
    let created = params
        .iter()
        .find(|(k, _)| k.as_str() == "created")
        .and_then(|(_, v)| v.as_integer())
        .map(i64::from)
        .ok_or("Signature-Input has no created timestamp")?;
    if (now_unix - created).unsigned_abs() > u64::from(skew_seconds) {
        return Err(format!(
            "signature created at {created} is more than {skew_seconds}s away from the gate's clock"
        ));
    }
    if let Some(expires) = params
        .iter()
        .find(|(k, _)| k.as_str() == "expires")
        .and_then(|(_, v)| v.as_integer())
        .map(i64::from)
        && expires < now_unix
    {
        return Err("signature expired".into());
    }

    // The signature base (RFC 9421 §2.5).
    let mut base = String::new();
    let mut covers_digest = false;
    for item in &inner.items {
        let name = item
            .bare_item
            .as_string()
            .map(|s| s.as_str().to_owned())
            .ok_or("a covered component is not a string")?;
        if !item.params.is_empty() {
            return Err(format!("component parameters are not supported (`{name}`)"));
        }
        let value = match name.as_str() {
            "@method" => request.method.to_ascii_uppercase(),
            "@authority" => request.authority.to_ascii_lowercase(),
            "@path" => {
                if request.path.is_empty() {
                    "/".to_owned()
                } else {
                    request.path.to_owned()
                }
            }
            other if other.starts_with('@') => {
                return Err(format!("derived component `{other}` is not supported"));
            }
            header => {
                if header == "content-digest" {
                    covers_digest = true;
                }
                let values = (request.header)(header);
                if values.is_empty() {
                    return Err(format!("covered header `{header}` is missing"));
                }
                values
                    .iter()
                    .map(|v| v.trim())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        base.push_str(&format!("\"{name}\": {value}\n"));
    }
    let signature_params = vec![ListEntry::InnerList(inner.clone())]
        .serialize()
        .ok_or("cannot serialise the signature parameters")?;
    base.push_str(&format!("\"@signature-params\": {signature_params}"));

    if !request.body.is_empty() {
        if !covers_digest {
            return Err("the signature does not cover content-digest".into());
        }
        verify_content_digest(&single(request, "content-digest")?, request.body)?;
    }

    let signature = regent_signature(&signature_header)?;
    let key = VerifyingKey::from_bytes(&to_array(public_key))
        .map_err(|e| format!("registered key is not an Ed25519 point: {e}"))?;
    let signature =
        Signature::from_slice(&signature).map_err(|_| "Signature is not 64 bytes".to_owned())?;
    key.verify_strict(base.as_bytes(), &signature)
        .map_err(|_| format!("RFC 9421 signature does not verify with key `{kid}`"))?;
    Ok(Rfc9421 { kid })
}

fn single(request: &SignedRequest<'_>, name: &str) -> Result<String, String> {
    let values = (request.header)(name);
    match values.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(format!("header `{name}` is missing")),
        _ => Ok(values.join(", ")),
    }
}

fn regent_member(input: &str) -> Result<(sfv::InnerList, sfv::Parameters), String> {
    let dict: sfv::Dictionary = Parser::new(input)
        .parse()
        .map_err(|e| format!("Signature-Input is not a structured dictionary: {e}"))?;
    let entry = dict
        .iter()
        .find(|(k, _)| k.as_str() == "regent")
        .map(|(_, v)| v)
        .ok_or("Signature-Input has no `regent` signature")?;
    match entry {
        ListEntry::InnerList(inner) => Ok((inner.clone(), inner.params.clone())),
        ListEntry::Item(_) => Err("Signature-Input `regent` is not an inner list".into()),
    }
}

fn string_param(params: &sfv::Parameters, name: &str) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .and_then(|(_, v)| v.as_string().map(|s| s.as_str().to_owned()))
}

fn regent_signature(header: &str) -> Result<Vec<u8>, String> {
    let dict: sfv::Dictionary = Parser::new(header)
        .parse()
        .map_err(|e| format!("Signature is not a structured dictionary: {e}"))?;
    match dict
        .iter()
        .find(|(k, _)| k.as_str() == "regent")
        .map(|(_, v)| v)
    {
        Some(ListEntry::Item(item)) => item
            .bare_item
            .as_byte_sequence()
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "Signature `regent` is not a byte sequence".to_owned()),
        _ => Err("Signature has no `regent` byte sequence".into()),
    }
}

fn verify_content_digest(header: &str, body: &[u8]) -> Result<(), String> {
    let dict: sfv::Dictionary = Parser::new(header)
        .parse()
        .map_err(|e| format!("Content-Digest is not a structured dictionary: {e}"))?;
    let Some(ListEntry::Item(item)) = dict
        .iter()
        .find(|(k, _)| k.as_str() == "sha-256")
        .map(|(_, v)| v)
    else {
        return Err("Content-Digest has no sha-256 member".into());
    };
    let given = item
        .bare_item
        .as_byte_sequence()
        .ok_or("Content-Digest sha-256 is not a byte sequence")?;
    if constant_time_eq(given, &Sha256::digest(body)) {
        Ok(())
    } else {
        Err(format!(
            "Content-Digest does not match the body (got {})",
            STANDARD.encode(given)
        ))
    }
}

fn to_array(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if bytes.len() == 32 {
        out.copy_from_slice(bytes);
    }
    out
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
pub(crate) mod tests {
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    /// Signs like `regent_control.crypto.sign_request_rfc9421` (an independent re-implementation
    /// of the documented wire format, for tests).
    pub(crate) fn sdk_sign(
        key: &SigningKey,
        method: &str,
        authority: &str,
        path: &str,
        body: &[u8],
        created: i64,
    ) -> Vec<(String, String)> {
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        let kid = ed25519_kid(&x);
        let mut headers = Vec::new();
        let mut covered = vec!["@method", "@authority", "@path"];
        if !body.is_empty() {
            headers.push((
                "content-digest".to_owned(),
                format!("sha-256=:{}:", STANDARD.encode(Sha256::digest(body))),
            ));
            covered.push("content-digest");
        }
        let params = format!(
            "({});created={created};keyid=\"{kid}\";alg=\"ed25519\";tag=\"regent-agent\"",
            covered
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut base = String::new();
        for c in &covered {
            let v = match *c {
                "@method" => method.to_owned(),
                "@authority" => authority.to_owned(),
                "@path" => path.to_owned(),
                _ => headers[0].1.clone(),
            };
            base.push_str(&format!("\"{c}\": {v}\n"));
        }
        base.push_str(&format!("\"@signature-params\": {params}"));
        let sig = key.sign(base.as_bytes());
        headers.push(("signature-input".into(), format!("regent={params}")));
        headers.push((
            "signature".into(),
            format!("regent=:{}:", STANDARD.encode(sig.to_bytes())),
        ));
        headers
    }

    fn verify_with(
        headers: &[(String, String)],
        body: &[u8],
        path: &str,
        key: &[u8],
        now: i64,
    ) -> Result<Rfc9421, String> {
        let lookup = |name: &str| {
            headers
                .iter()
                .filter(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        verify_rfc9421(
            &SignedRequest {
                method: "POST",
                authority: "127.0.0.1:8009",
                path,
                header: &lookup,
                body,
            },
            key,
            now,
            300,
        )
    }

    #[test]
    fn rfc9421_signatures_verify_and_tampering_is_caught() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let public = key.verifying_key().to_bytes();
        let body = br#"{"agent_id":"a","tool":"payments"}"#;
        let headers = sdk_sign(
            &key,
            "POST",
            "127.0.0.1:8009",
            "/v1/control/decisions",
            body,
            1000,
        );
        let kid = rfc9421_keyid(&headers[1].1).unwrap();
        assert_eq!(kid, ed25519_kid(&URL_SAFE_NO_PAD.encode(public)));
        assert_eq!(
            verify_with(&headers, body, "/v1/control/decisions", &public, 1010)
                .unwrap()
                .kid,
            kid
        );
        // A retry with the very same headers is still fine.
        assert!(verify_with(&headers, body, "/v1/control/decisions", &public, 1200).is_ok());
        // Body swapped: the digest no longer matches.
        let err = verify_with(&headers, b"{}", "/v1/control/decisions", &public, 1010).unwrap_err();
        assert!(err.contains("Content-Digest"), "{err}");
        // Another path: the signature no longer verifies.
        let err = verify_with(&headers, body, "/v1/control/other", &public, 1010).unwrap_err();
        assert!(err.contains("does not verify"), "{err}");
        // Stale.
        let err = verify_with(&headers, body, "/v1/control/decisions", &public, 5000).unwrap_err();
        assert!(err.contains("created"), "{err}");
        // Another key.
        let other = SigningKey::from_bytes(&[9u8; 32])
            .verifying_key()
            .to_bytes();
        assert!(verify_with(&headers, body, "/v1/control/decisions", &other, 1010).is_err());
    }

    #[test]
    fn hmac_matches_the_documented_derivation() {
        let body = br#"{"x":1}"#;
        let secret = derive_agent_secret("rgnt_ctrl_k", "agent_a");
        let sig = hmac_sha256_hex(secret.as_bytes(), body);
        let header = format!("hmac-sha256={sig}");
        assert!(
            verify_hmac(
                "rgnt_ctrl_k",
                "agent_a",
                body,
                &header,
                Some("100"),
                120,
                300
            )
            .is_ok()
        );
        assert!(verify_hmac("rgnt_ctrl_k", "agent_b", body, &header, None, 120, 300).is_err());
        assert!(verify_hmac("rgnt_ctrl_k", "agent_a", b"{}", &header, None, 120, 300).is_err());
        assert!(
            verify_hmac(
                "rgnt_ctrl_k",
                "agent_a",
                body,
                &header,
                Some("100"),
                9999,
                300
            )
            .is_err()
        );
        assert!(verify_hmac("rgnt_ctrl_k", "agent_a", body, "sha1=00", None, 120, 300).is_err());
    }

    #[test]
    fn public_keys_are_checked() {
        assert!(decode_ed25519_public("abc").is_err());
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let text = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        assert_eq!(decode_ed25519_public(&text).unwrap().len(), 32);
    }
}
