//! Shared helpers of the planted tests.

pub mod pytorch_like;
