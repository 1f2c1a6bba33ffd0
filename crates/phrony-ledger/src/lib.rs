//! phrony-ledger (work in progress).
