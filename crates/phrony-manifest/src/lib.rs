//! Phrony manifest model (work in progress).
