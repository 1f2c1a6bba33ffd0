//! A small client of the admin routes, for `mock-gate approvals …` and `mock-gate audit
//! export --url`. Plain HTTP only (the gate is a local twin).

use axum::body::Bytes;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::engine::Resolution;

/// An admin-route call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The URL is not a usable `http://host:port` base.
    #[error("invalid gate URL `{url}`: {message}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The gate could not be reached.
    #[error("cannot reach the gate at {url}: {message}")]
    Transport {
        /// The URL.
        url: String,
        /// The transport error.
        message: String,
    },
    /// The gate answered with an error.
    #[error("the gate answered {status}: {detail}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Its `detail`.
        detail: String,
    },
}

/// A client of one gate's admin routes.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    admin_key: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl AdminClient {
    /// A client for the gate at `base_url` (e.g. `http://127.0.0.1:8009`).
    ///
    /// # Errors
    /// [`AdminError::Url`] when the URL is not plain `http://`.
    pub fn new(base_url: &str, admin_key: &str) -> Result<Self, AdminError> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(AdminError::Url {
                url: base_url.to_owned(),
                message: "only http:// URLs are supported".into(),
            });
        }
        Ok(Self {
            base,
            admin_key: admin_key.to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Bytes, AdminError> {
        let url = format!("{}{path}", self.base);
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.admin_key))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| AdminError::Url {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| AdminError::Transport {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| AdminError::Transport {
                url: url.clone(),
                message: e.to_string(),
            })?
            .to_bytes();
        if status != StatusCode::OK {
            let detail = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(AdminError::Status {
                status: status.as_u16(),
                detail,
            });
        }
        Ok(bytes)
    }

    fn json(bytes: &Bytes) -> Result<Value, AdminError> {
        serde_json::from_slice(bytes).map_err(|e| AdminError::Status {
            status: 200,
            detail: format!("the answer is not JSON: {e}"),
        })
    }

    /// The approvals, optionally filtered by status.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn approvals(&self, status: Option<&str>) -> Result<Vec<Value>, AdminError> {
        let path = match status {
            Some(s) => format!("/v1/admin/approvals?status={s}"),
            None => "/v1/admin/approvals".into(),
        };
        let value = Self::json(&self.call(Method::GET, &path, None).await?)?;
        Ok(value
            .get("approvals")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// Approves or rejects one escalation in the name of `approver` (recorded in the audit
    /// log; the gate refuses a missing or unprintable name with 400).
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn resolve(
        &self,
        reference: &str,
        resolution: Resolution,
        approver: &str,
        comment: Option<&str>,
        approver_token: Option<&str>,
    ) -> Result<Value, AdminError> {
        let verb = match resolution {
            Resolution::Approve => "approve",
            Resolution::Reject => "reject",
        };
        let body =
            json!({"approver": approver, "comment": comment, "approver_token": approver_token});
        Self::json(
            &self
                .call(
                    Method::POST,
                    &format!("/v1/admin/approvals/{reference}/{verb}"),
                    Some(body),
                )
                .await?,
        )
    }

    /// The audit log as JSONL text.
    ///
    /// # Errors
    /// [`AdminError`].
    pub async fn audit_jsonl(&self) -> Result<String, AdminError> {
        let bytes = self.call(Method::GET, "/v1/admin/audit", None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
