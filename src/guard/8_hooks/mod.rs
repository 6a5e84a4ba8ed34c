//! Entry points: the exported wrappers, `dlsym`, `dlvsym`, entry-point routing, exec shims.

pub mod dlsym;
pub mod dlvsym;
pub mod exec;
pub mod route;
pub mod trampoline;
pub mod wrappers;
