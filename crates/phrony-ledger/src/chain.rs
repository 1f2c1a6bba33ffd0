//! The hash chain: canonical JSON, the event hash, and the verifier (pure code, no IO).
//!
//! # Hash definition (format `phrony.event.v1`)
//!
//! `hash = lowercase_hex(sha256(E))` where `E` is the UTF-8 text of the JSON array
//!
//! ```text
//! ["phrony.event.v1", stream, seq, type, ts, actor, call_id, turn, payload, prev_hash]
//! ```
//!
//! written with no whitespace, where `seq` and `turn` are JSON integers (`turn` and `call_id`
//! may be `null`), `ts` is the RFC 3339 UTC timestamp with exactly six fractional digits and a
//! `Z` suffix, and `payload` is the payload's canonical JSON, embedded as a JSON value.
//! Canonical JSON is: object keys sorted by Unicode code point, no insignificant whitespace,
//! strings escaped and numbers written as `serde_json` writes them. The first event of every
//! stream has `prev_hash` = 64 zeros ([`GENESIS_HASH`]); each later event's `prev_hash` is the
//! `hash` of the event with the previous `seq`.
//!
//! ## Attributed events
//!
//! An event that records how its actor was established (schema version 4: every event whose
//! actor is a caller, not one of the runtime's own actors) appends two elements to the array:
//!
//! ```text
//! ["phrony.event.v1", stream, seq, type, ts, actor, call_id, turn, payload, prev_hash,
//!  actor_verification, actor_via]
//! ```
//!
//! where `actor_verification` is the stored verification string (`unverified`, `token`, `oidc`,
//! `mtls`) and `actor_via` the relaying principal's name or `null`. An event without a
//! verification (written before attribution existed, or by the runtime itself: `system`,
//! `system:timeout`, `agent`, `policy`, `worker`) hashes exactly the ten-element array above,
//! so logs written by earlier builds verify unchanged. The two forms cannot collide: the arrays
//! differ in length. `Event::recompute_hash` applies the same rule.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The `prev_hash` of the first event in every stream.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Version tag mixed into every event hash.
const HASH_FORMAT: &str = "phrony.event.v1";

/// Writes `value` as canonical JSON (sorted keys, no whitespace).
///
/// Key order is enforced here rather than relying on `serde_json::Map` being a `BTreeMap`,
/// because another crate enabling serde_json's `preserve_order` feature would silently change
/// that for the whole build.
#[must_use]
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(val, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        // Scalars have exactly one serde_json rendering.
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Formats a timestamp the way the chain hashes and SQLite stores it.
#[must_use]
pub(crate) fn format_ts(ts: &DateTime<Utc>) -> String {
    ts.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The fields an event hash covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HashInput<'a> {
    pub(crate) stream: &'a str,
    pub(crate) seq: i64,
    pub(crate) event_type: &'a str,
    pub(crate) ts: &'a DateTime<Utc>,
    pub(crate) actor: &'a str,
    pub(crate) call_id: Option<&'a str>,
    pub(crate) turn: Option<i64>,
    /// Canonical JSON text of the payload.
    pub(crate) payload: &'a str,
    pub(crate) prev_hash: &'a str,
    /// `None` for an event without attribution (the ten-element form).
    pub(crate) actor_verification: Option<&'a str>,
    pub(crate) actor_via: Option<&'a str>,
}

/// Computes the event hash defined in the module docs.
#[must_use]
pub(crate) fn event_hash(input: &HashInput<'_>) -> String {
    let s = |v: &str| Value::String(v.to_owned()).to_string();
    let mut encoded = String::with_capacity(input.payload.len() + 256);
    encoded.push('[');
    encoded.push_str(&s(HASH_FORMAT));
    encoded.push(',');
    encoded.push_str(&s(input.stream));
    encoded.push(',');
    encoded.push_str(&input.seq.to_string());
    encoded.push(',');
    encoded.push_str(&s(input.event_type));
    encoded.push(',');
    encoded.push_str(&s(&format_ts(input.ts)));
    encoded.push(',');
    encoded.push_str(&s(input.actor));
    encoded.push(',');
    match input.call_id {
        Some(call_id) => encoded.push_str(&s(call_id)),
        None => encoded.push_str("null"),
    }
    encoded.push(',');
    match input.turn {
        Some(turn) => encoded.push_str(&turn.to_string()),
        None => encoded.push_str("null"),
    }
    encoded.push(',');
    encoded.push_str(input.payload);
    encoded.push(',');
    encoded.push_str(&s(input.prev_hash));
    if let Some(verification) = input.actor_verification {
        encoded.push(',');
        encoded.push_str(&s(verification));
        encoded.push(',');
        match input.actor_via {
            Some(via) => encoded.push_str(&s(via)),
            None => encoded.push_str("null"),
        }
    }
    encoded.push(']');
    hex::encode(Sha256::digest(encoded.as_bytes()))
}

/// One stored event row as read back for verification.
#[derive(Debug, Clone)]
pub(crate) struct StoredEvent {
    pub(crate) stream: String,
    pub(crate) seq: i64,
    pub(crate) event_type: String,
    pub(crate) ts: DateTime<Utc>,
    pub(crate) actor: String,
    pub(crate) call_id: Option<String>,
    pub(crate) turn: Option<i64>,
    pub(crate) payload: String,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
    pub(crate) actor_verification: Option<String>,
    pub(crate) actor_via: Option<String>,
}

impl StoredEvent {
    pub(crate) fn hash_input(&self) -> HashInput<'_> {
        HashInput {
            stream: &self.stream,
            seq: self.seq,
            event_type: &self.event_type,
            ts: &self.ts,
            actor: &self.actor,
            call_id: self.call_id.as_deref(),
            turn: self.turn,
            payload: &self.payload,
            prev_hash: &self.prev_hash,
            actor_verification: self.actor_verification.as_deref(),
            actor_via: self.actor_via.as_deref(),
        }
    }
}

/// What kind of damage verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViolationKind {
    /// The row's content no longer matches its stored hash (an edited row).
    HashMismatch,
    /// The row's `prev_hash` is not the previous row's hash (a deleted, inserted or
    /// reordered row, or a rewritten predecessor).
    BrokenLink,
    /// `seq` does not continue 1, 2, 3, … (a deleted row or renumbering).
    SeqGap {
        /// The sequence number the chain needed next.
        expected: u64,
    },
    /// The payload is not the canonical JSON the ledger writes.
    MalformedPayload,
    /// The log ends before or after the stream head recorded on every append (truncation, or
    /// rows appended outside the ledger).
    HeadMismatch {
        /// `last_seq` recorded in the stream head.
        head_seq: u64,
    },
}

/// The first point at which a stream's chain is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainViolation {
    /// The first sequence number that fails verification (for [`ViolationKind::HeadMismatch`],
    /// the first seq at which log and head disagree).
    pub seq: u64,
    /// What is wrong.
    pub kind: ViolationKind,
    /// A one-line human explanation.
    pub message: String,
}

/// Incremental verifier: feed events in ascending `seq` order.
#[derive(Debug)]
pub(crate) struct ChainVerifier {
    stream: String,
    next_seq: i64,
    prev_hash: String,
}

impl ChainVerifier {
    pub(crate) fn new(stream: &str) -> Self {
        Self {
            stream: stream.to_owned(),
            next_seq: 1,
            prev_hash: GENESIS_HASH.to_owned(),
        }
    }

    /// Number of events accepted so far.
    pub(crate) fn checked(&self) -> u64 {
        u64::try_from(self.next_seq - 1).unwrap_or(0)
    }

    pub(crate) fn check(&mut self, event: &StoredEvent) -> Result<(), ChainViolation> {
        let stream = &self.stream;
        let violation = |seq: i64, kind, message: String| ChainViolation {
            seq: u64::try_from(seq).unwrap_or(0),
            kind,
            message: format!("stream {stream} seq {seq}: {message}"),
        };
        if event.seq != self.next_seq {
            // A deleted row shows up as a gap at the row after it; report the missing seq.
            return Err(violation(
                self.next_seq,
                ViolationKind::SeqGap {
                    expected: u64::try_from(self.next_seq).unwrap_or(0),
                },
                format!("expected seq {}, found seq {}", self.next_seq, event.seq),
            ));
        }
        if event.prev_hash != self.prev_hash {
            return Err(violation(
                event.seq,
                ViolationKind::BrokenLink,
                format!(
                    "prev_hash {} does not match the previous event's hash {}",
                    event.prev_hash, self.prev_hash
                ),
            ));
        }
        let recomputed = event_hash(&event.hash_input());
        if recomputed != event.hash {
            return Err(violation(
                event.seq,
                ViolationKind::HashMismatch,
                format!(
                    "content hash {recomputed} does not match stored hash {} (the event was modified)",
                    event.hash
                ),
            ));
        }
        match serde_json::from_str::<Value>(&event.payload) {
            Ok(value) if canonical_json(&value) == event.payload => {}
            _ => {
                return Err(violation(
                    event.seq,
                    ViolationKind::MalformedPayload,
                    "payload is not canonical JSON".to_owned(),
                ));
            }
        }
        self.prev_hash.clone_from(&event.hash);
        self.next_seq += 1;
        Ok(())
    }

    /// Checks the end of the log against the stream head.
    pub(crate) fn finish(&self, head_seq: i64, head_hash: &str) -> Result<(), ChainViolation> {
        let last = self.next_seq - 1;
        let (seq, message) = if last < head_seq {
            (
                last + 1,
                format!("the log ends at seq {last} but the stream head records seq {head_seq}"),
            )
        } else if last > head_seq {
            (
                head_seq + 1,
                format!("the log continues to seq {last} past the stream head seq {head_seq}"),
            )
        } else if head_seq > 0 && self.prev_hash != head_hash {
            (
                last,
                format!(
                    "the last event's hash {} differs from the stream head hash {head_hash}",
                    self.prev_hash
                ),
            )
        } else {
            return Ok(());
        };
        Err(ChainViolation {
            seq: u64::try_from(seq).unwrap_or(0),
            kind: ViolationKind::HeadMismatch {
                head_seq: u64::try_from(head_seq).unwrap_or(0),
            },
            message: format!("stream {}: {message}", self.stream),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let v = json!({"b": 1, "a": {"d": [true, null, {"z": 1, "y": "é\n"}], "c": 1.5}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":1.5,"d":[true,null,{"y":"é\n","z":1}]},"b":1}"#
        );
    }

    #[test]
    fn canonical_json_is_stable_through_a_reparse() {
        let v = json!({"k": [1, -2, 3.25, 1e100, u64::MAX, "\u{0001}"]});
        let once = canonical_json(&v);
        let reparsed: Value = serde_json::from_str(&once).unwrap();
        assert_eq!(canonical_json(&reparsed), once);
    }

    fn stored(seq: i64, prev: &str, payload: &str) -> StoredEvent {
        let ts = DateTime::parse_from_rfc3339("2025-01-02T03:04:05.123456Z")
            .unwrap()
            .to_utc();
        let mut e = StoredEvent {
            stream: "s".into(),
            seq,
            event_type: "t.x".into(),
            ts,
            actor: "a".into(),
            call_id: None,
            turn: Some(1),
            payload: payload.into(),
            prev_hash: prev.into(),
            hash: String::new(),
            actor_verification: None,
            actor_via: None,
        };
        e.hash = event_hash(&e.hash_input());
        e
    }

    #[test]
    fn hash_covers_every_field() {
        let base = stored(1, GENESIS_HASH, "{}");
        let variants = [
            StoredEvent {
                stream: "s2".into(),
                ..base.clone()
            },
            StoredEvent {
                seq: 2,
                ..base.clone()
            },
            StoredEvent {
                event_type: "t.y".into(),
                ..base.clone()
            },
            StoredEvent {
                ts: base.ts + chrono::Duration::microseconds(1),
                ..base.clone()
            },
            StoredEvent {
                actor: "b".into(),
                ..base.clone()
            },
            StoredEvent {
                call_id: Some("c".into()),
                ..base.clone()
            },
            StoredEvent {
                turn: None,
                ..base.clone()
            },
            StoredEvent {
                payload: "{\"a\":1}".into(),
                ..base.clone()
            },
            StoredEvent {
                prev_hash: "1".repeat(64),
                ..base.clone()
            },
            StoredEvent {
                actor_verification: Some("unverified".into()),
                ..base.clone()
            },
        ];
        let attributed = StoredEvent {
            actor_verification: Some("token".into()),
            ..base.clone()
        };
        let attributed_hash = event_hash(&attributed.hash_input());
        for v in [
            StoredEvent {
                actor_verification: Some("oidc".into()),
                ..attributed.clone()
            },
            StoredEvent {
                actor_via: Some("approvals-ui".into()),
                ..attributed.clone()
            },
        ] {
            assert_ne!(event_hash(&v.hash_input()), attributed_hash, "{v:?}");
        }
        for v in variants {
            assert_ne!(event_hash(&v.hash_input()), base.hash, "{v:?}");
        }
    }

    #[test]
    fn an_unattributed_event_hashes_the_version_1_array_and_an_attributed_one_appends() {
        let base = stored(1, GENESIS_HASH, "{}");
        let v1 = format!(
            "[\"phrony.event.v1\",\"s\",1,\"t.x\",\"2025-01-02T03:04:05.123456Z\",\"a\",null,1,{{}},\"{GENESIS_HASH}\"]"
        );
        assert_eq!(base.hash, hex::encode(Sha256::digest(v1.as_bytes())));
        let relayed = StoredEvent {
            actor_verification: Some("token".into()),
            actor_via: Some("approvals-ui".into()),
            ..base.clone()
        };
        let v4 = format!("{},\"token\",\"approvals-ui\"]", &v1[..v1.len() - 1]);
        assert_eq!(
            event_hash(&relayed.hash_input()),
            hex::encode(Sha256::digest(v4.as_bytes()))
        );
    }

    #[test]
    fn verifier_accepts_a_chain_and_names_the_first_bad_seq() {
        let e1 = stored(1, GENESIS_HASH, "{}");
        let e2 = stored(2, &e1.hash, r#"{"a":1}"#);
        let e3 = stored(3, &e2.hash, "[]");
        let mut v = ChainVerifier::new("s");
        for e in [&e1, &e2, &e3] {
            v.check(e).unwrap();
        }
        v.finish(3, &e3.hash).unwrap();
        assert_eq!(v.finish(4, &e3.hash).unwrap_err().seq, 4);

        let mut v = ChainVerifier::new("s");
        v.check(&e1).unwrap();
        let err = v.check(&e3).unwrap_err();
        assert_eq!(
            (err.seq, err.kind),
            (2, ViolationKind::SeqGap { expected: 2 })
        );

        let mut v = ChainVerifier::new("s");
        v.check(&e1).unwrap();
        let edited = StoredEvent {
            payload: r#"{"a":2}"#.into(),
            ..e2.clone()
        };
        assert_eq!(
            v.check(&edited).unwrap_err().kind,
            ViolationKind::HashMismatch
        );

        let mut v = ChainVerifier::new("s");
        let not_canonical = stored(1, GENESIS_HASH, "{ }");
        assert_eq!(
            v.check(&not_canonical).unwrap_err().kind,
            ViolationKind::MalformedPayload
        );
    }
}
