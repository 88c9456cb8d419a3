//! In-memory [`ObjectClient`](super::ObjectClient) for unit tests of the core. (Being written.)
