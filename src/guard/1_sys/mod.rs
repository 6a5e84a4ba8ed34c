//! Primitives: the C and CUDA ABI types, signal-safe buffers and writes, the thread's
//! signal mask and a signal's action by system call, the lifecycle map of process-lifetime
//! state (`lifecycle`), the loaded objects (`loaded`), the start environment in memory
//! (`start_block`), symbol lookup in ELF files, the C library and a driver the program links, and the two
//! linker-level pieces (lazy libc binding, page-aligned data).

pub mod elfsym;
pub mod ffi;
pub mod layout;
pub mod lazy_libc;
pub mod libcsym;
pub mod lifecycle;
pub mod loaded;
pub mod pyframes;
pub mod sigaction;
pub mod sigmask;
pub mod signal_safe;
pub mod start_block;
