//! The subject of a mutual-TLS client certificate, for the edge's [`Credentials`].
//!
//! The mTLS principal is the **common name (CN)** of the leaf certificate's subject (the
//! certificate was already verified against `RUNTIME_TLS_CLIENT_CA` by the TLS handshake). A
//! certificate without a CN, with more than one CN, or with a CN that is not UTF-8 is refused:
//! such a subject cannot be mapped to roles unambiguously.
//!
//! [`Credentials`]: phrony_auth::Credentials

use phrony_auth::AuthError;
use tonic::Request;
use x509_parser::prelude::{FromDer as _, X509Certificate};

/// The CN of the client certificate a request's TLS connection presented: `Ok(None)` over
/// plaintext or TLS without a client certificate.
///
/// # Errors
/// [`AuthError::Rejected`] when the certificate has no usable CN (see the module docs).
pub fn peer_subject<T>(request: &Request<T>) -> Result<Option<String>, AuthError> {
    leaf_subject(request.peer_certs().as_deref())
}

/// [`peer_subject`] from the extensions of the raw HTTP request (what the access edge sees
/// before tonic builds its `Request`): the connection info tonic's TLS server put there.
///
/// # Errors
/// As [`peer_subject`].
pub(crate) fn extensions_peer_subject(
    extensions: &tonic::codegen::http::Extensions,
) -> Result<Option<String>, AuthError> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs);
    leaf_subject(certs.as_deref())
}

/// The CN of the first (leaf) certificate of a verified chain, `None` without one.
fn leaf_subject<C: AsRef<[u8]>>(certs: Option<&Vec<C>>) -> Result<Option<String>, AuthError> {
    match certs.and_then(|c| c.first()) {
        None => Ok(None),
        Some(leaf) => certificate_subject(leaf.as_ref()).map(Some),
    }
}

/// The subject CN of a DER certificate.
///
/// # Errors
/// [`AuthError::Rejected`] for a certificate that does not parse or has no single UTF-8 CN.
pub fn certificate_subject(der: &[u8]) -> Result<String, AuthError> {
    let rejected = |reason: String| AuthError::Rejected { reason };
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| rejected(format!("client certificate does not parse: {e}")))?;
    let subject = cert.subject();
    let mut cns = subject.iter_common_name();
    let (Some(cn), None) = (cns.next(), cns.next()) else {
        return Err(rejected(format!(
            "client certificate subject {subject:?} must have exactly one common name (CN)",
            subject = subject.to_string()
        )));
    };
    let cn = cn
        .as_str()
        .map_err(|_| rejected("client certificate CN is not a UTF-8 string".to_owned()))?;
    if cn.trim().is_empty() {
        return Err(rejected("client certificate CN is empty".to_owned()));
    }
    Ok(cn.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn cert(dn: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            params.distinguished_name.push(t.clone(), *v);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_subject_is_the_common_name() {
        let der = cert(&[
            (rcgen::DnType::OrganizationName, "Acme"),
            (rcgen::DnType::CommonName, "refund-worker"),
        ]);
        assert_eq!(certificate_subject(&der).unwrap(), "refund-worker");
        let none = cert(&[(rcgen::DnType::OrganizationName, "Acme")]);
        let err = certificate_subject(&none).unwrap_err().to_string();
        assert!(err.contains("common name"), "{err}");
        assert!(certificate_subject(b"junk").is_err());
        // Plaintext: no peer certificates.
        assert_eq!(peer_subject(&Request::new(())).unwrap(), None);
    }
}
