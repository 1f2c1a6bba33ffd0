//! Phrony policy engine (work in progress).
