//! What the recording proxy keeps between calls: who owns a key.

pub mod cache;
