//! Cursor pagination and a tiny `WHERE` builder shared by the list reads.
//!
//! Lists are ordered by `(created_at DESC, id DESC)`, which never changes for a row, so a cursor
//! (the last row's `created_at` and id) stays valid while rows are added or updated: no row is
//! skipped or repeated across pages. The token is opaque to callers: URL-safe base64 of
//! `<kind>|<created_at>|<id>`, where `kind` stops a token of one list being used on another.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

use crate::chain::format_ts;
use crate::db::Arg;
use crate::error::{LedgerError, Result};

/// How many items a request that names no page size ([`PageRequest::size`] 0) gets: every
/// match up to this cap. The reference runtime's lists had no paging, and clients written for
/// it (the published 0.1.0 SDK) send no size and read no token, so they must get every row;
/// the cap only bounds a pathological list, and a capped page still carries
/// [`Page::next_token`] so a paging client can continue.
pub const UNSIZED_PAGE_LIMIT: u32 = 10_000;
/// Largest explicit page size; bigger requests are clamped.
pub const MAX_PAGE_SIZE: u32 = 1000;

/// Which page of a list to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// Items per page: 0 means every match up to [`UNSIZED_PAGE_LIMIT`]; other values above
    /// [`MAX_PAGE_SIZE`] are clamped.
    pub size: u32,
    /// The `next_token` of the previous page; `None` for the first page.
    pub token: Option<String>,
}

impl PageRequest {
    /// The first page with `size` items.
    #[must_use]
    pub fn first(size: u32) -> Self {
        Self { size, token: None }
    }

    /// The page after the one that returned `token`.
    #[must_use]
    pub fn after(size: u32, token: impl Into<String>) -> Self {
        Self {
            size,
            token: Some(token.into()),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        match self.size {
            0 => UNSIZED_PAGE_LIMIT,
            n => n.min(MAX_PAGE_SIZE),
        }
    }
}

/// One page of a list, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Pass to [`PageRequest::after`] for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// A decoded cursor: the position after which the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) id: String,
}

pub(crate) fn encode_token(kind: &str, created_at: &DateTime<Utc>, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{kind}|{}|{id}", format_ts(created_at)))
}

pub(crate) fn decode_token(kind: &str, token: &str) -> Result<Cursor> {
    let invalid = || LedgerError::invalid(format!("invalid page token {token:?}"));
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let mut parts = text.splitn(3, '|');
    let (Some(k), Some(ts), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    if k != kind {
        return Err(LedgerError::invalid(format!(
            "page token {token:?} belongs to another list"
        )));
    }
    let created_at = DateTime::parse_from_rfc3339(ts)
        .map_err(|_| invalid())?
        .to_utc();
    if id.is_empty() {
        return Err(invalid());
    }
    Ok(Cursor {
        created_at,
        id: id.to_owned(),
    })
}

/// Collects `AND`-joined conditions with `$n` placeholders numbered in order.
#[derive(Debug, Default)]
pub(crate) struct Where {
    clauses: Vec<String>,
    pub(crate) args: Vec<Arg>,
}

impl Where {
    /// The next placeholder, after binding `arg` to it.
    pub(crate) fn bind(&mut self, arg: Arg) -> String {
        self.args.push(arg);
        format!("${}", self.args.len())
    }

    /// Adds a condition (using placeholders from [`Where::bind`]).
    pub(crate) fn push(&mut self, clause: String) {
        self.clauses.push(clause);
    }

    /// `WHERE a AND b …`, or the empty string.
    pub(crate) fn sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.clauses.join(" AND "))
        }
    }

    /// Restricts to rows after the cursor `(created_at, id)` in `(created_at DESC, id DESC)`
    /// order; `id` is bound with the id column's native type.
    pub(crate) fn after_cursor(
        &mut self,
        created_col: &str,
        id_col: &str,
        created_at: DateTime<Utc>,
        id: Arg,
    ) {
        let ts = self.bind(Arg::from(created_at));
        let cid = self.bind(id);
        self.push(format!(
            "({created_col} < {ts} OR ({created_col} = {ts} AND {id_col} < {cid}))"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_are_checked() {
        let ts = DateTime::parse_from_rfc3339("2025-01-02T03:04:05.123456Z")
            .map(|t| t.to_utc())
            .unwrap_or_default();
        let token = encode_token("s", &ts, "run_1");
        assert_eq!(
            decode_token("s", &token).ok(),
            Some(Cursor {
                created_at: ts,
                id: "run_1".into()
            })
        );
        assert!(matches!(
            decode_token("a", &token),
            Err(LedgerError::InvalidArgument { .. })
        ));
        assert!(matches!(
            decode_token("s", "not base64!"),
            Err(LedgerError::InvalidArgument { .. })
        ));
        assert!(matches!(
            decode_token("s", &URL_SAFE_NO_PAD.encode("s|yesterday|x")),
            Err(LedgerError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn page_sizes_default_and_clamp() {
        assert_eq!(PageRequest::default().limit(), UNSIZED_PAGE_LIMIT);
        assert_eq!(PageRequest::first(5).limit(), 5);
        assert_eq!(PageRequest::first(1_000_000).limit(), MAX_PAGE_SIZE);
    }
}
