//! phrony-grpc (work in progress).
