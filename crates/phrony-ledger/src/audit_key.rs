//! The audit key: the 32-byte HMAC key, kept outside the database, that MACs every stream's
//! head in `chain_heads` (see the `audit` module). A leaf: the storage layer carries it in a
//! write transaction and the append seals heads with it, without importing the verifier.

use std::fmt;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The number of shards of the sealed stream set (`stream_set_shards`, migration 0024; the
/// table's `CHECK` and every shard's MAC carry it). A stream belongs to shard
/// `SHA-256(name)[0] mod STREAM_SET_SHARDS`, so the creations of streams in different shards
/// lock different rows.
pub(crate) const STREAM_SET_SHARDS: usize = 16;

/// The 32-byte key that MACs the chain heads. Kept outside the database. `Debug` shows only
/// its [`AuditKey::key_id`].
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKey([u8; AuditKey::LEN]);

impl AuditKey {
    /// Key length in bytes.
    pub const LEN: usize = 32;

    /// Wraps raw key bytes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        Self(bytes)
    }

    fn hmac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; 32 bytes cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
        }
    }

    /// A non-secret identifier of the key (16 hex digits of a domain-separated HMAC), recorded
    /// when the log is sealed so that a wrong key file is named as such.
    #[must_use]
    pub fn key_id(&self) -> String {
        let mut mac = self.hmac();
        mac.update(b"phrony.audit.key-id");
        hex::encode(&mac.finalize().into_bytes()[..8])
    }

    fn head_mac(&self, stream: &str, seq: i64, hash: &str) -> HmacSha256 {
        let mut mac = self.hmac();
        mac.update(b"phrony.head.v1");
        mac.update(
            &u64::try_from(stream.len())
                .unwrap_or(u64::MAX)
                .to_be_bytes(),
        );
        mac.update(stream.as_bytes());
        mac.update(&seq.to_be_bytes());
        mac.update(hash.as_bytes());
        mac
    }

    /// The MAC of a stream head, as stored in `chain_heads.mac`.
    #[must_use]
    pub(crate) fn mac(&self, stream: &str, seq: i64, hash: &str) -> String {
        hex::encode(self.head_mac(stream, seq, hash).finalize().into_bytes())
    }

    /// Whether `mac_hex` is the MAC of the head (compared in constant time).
    pub(crate) fn verifies(&self, stream: &str, seq: i64, hash: &str, mac_hex: &str) -> bool {
        let Ok(mac) = hex::decode(mac_hex) else {
            return false;
        };
        self.head_mac(stream, seq, hash).verify_slice(&mac).is_ok()
    }
}

impl AuditKey {
    fn stream_set_hmac(&self, streams: i64, digest: &str) -> HmacSha256 {
        let mut mac = self.hmac();
        mac.update(b"phrony.stream-set.v1");
        mac.update(&streams.to_be_bytes());
        mac.update(digest.as_bytes());
        mac
    }

    /// The MAC of the single-row stream set of builds before migration 0024 (`stream_set.mac`):
    /// the number of streams and the digest of their names.
    #[must_use]
    pub(crate) fn stream_set_mac(&self, streams: i64, digest: &str) -> String {
        hex::encode(
            self.stream_set_hmac(streams, digest)
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `mac_hex` is the MAC of the stream set (compared in constant time).
    pub(crate) fn stream_set_verifies(&self, streams: i64, digest: &str, mac_hex: &str) -> bool {
        let Ok(mac) = hex::decode(mac_hex) else {
            return false;
        };
        self.stream_set_hmac(streams, digest)
            .verify_slice(&mac)
            .is_ok()
    }
}

impl AuditKey {
    fn stream_set_shard_hmac(&self, shard: usize, streams: i64, digest: &str) -> HmacSha256 {
        let mut mac = self.hmac();
        mac.update(b"phrony.stream-set-shard.v1");
        mac.update(
            &u64::try_from(STREAM_SET_SHARDS)
                .unwrap_or(u64::MAX)
                .to_be_bytes(),
        );
        mac.update(&u64::try_from(shard).unwrap_or(u64::MAX).to_be_bytes());
        mac.update(&streams.to_be_bytes());
        mac.update(digest.as_bytes());
        mac
    }

    /// The MAC of one shard of the stream set (`stream_set_shards.mac`): the number of shards,
    /// the shard's number, the number of its streams and the digest of their names, so a row
    /// cannot be moved to another shard or to a set of another size.
    #[must_use]
    pub(crate) fn stream_set_shard_mac(&self, shard: usize, streams: i64, digest: &str) -> String {
        hex::encode(
            self.stream_set_shard_hmac(shard, streams, digest)
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `mac_hex` is the MAC of the shard (compared in constant time).
    pub(crate) fn stream_set_shard_verifies(
        &self,
        shard: usize,
        streams: i64,
        digest: &str,
        mac_hex: &str,
    ) -> bool {
        let Ok(mac) = hex::decode(mac_hex) else {
            return false;
        };
        self.stream_set_shard_hmac(shard, streams, digest)
            .verify_slice(&mac)
            .is_ok()
    }
}

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuditKey(id {})", self.key_id())
    }
}
