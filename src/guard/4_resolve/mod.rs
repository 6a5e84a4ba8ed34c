//! Resolving real functions: the C library's and each CUDA major's, into the table's slots.

pub mod dl;
pub mod exec_real;
pub mod internal;
pub mod majors;
pub mod real;
