//! phrony-proto (work in progress).
