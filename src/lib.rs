//! librankguard.so: the preload library that enforces the one-rank-one-GPU contract.
#![deny(unsafe_code)]

pub mod cvd;
