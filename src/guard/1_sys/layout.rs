//! Where the loader writes: page-aligned starts for the library's relocated data.
//!
//! At every process start the loader writes each page that carries a relocation (a
//! copy-on-write fault, ~0.7 % of `/bin/true`'s start-up each on the reference VM,
//! docs/benchmarks.md, "Written pages"), in every process the library is preloaded into.
//! Two such regions remain: the RELRO data (`.data.rel.ro`, `.init_array`, `.dynamic`,
//! `.got`: ~9.4 KB of pointers, std's panic locations and vtables most of them) and the
//! last writable page (the lazy PLT slots of `.got.plt`, beside `FORWARD` and std's few
//! relocated statics in `.data`). Where they start in a page followed from the
//! size of everything before them, so the RELRO data spanned 4 pages where 3 hold it, and
//! `.data`'s relocations could fall on a page of their own.
//!
//! The two empty sections below, aligned to 4 KiB and kept by the linker (`R`,
//! SHF_GNU_RETAIN), give `.data.rel.ro` and `.data` that alignment: each starts a page, so
//! the RELRO data takes 3 pages, and `.data` (2.7 KB, every relocation-free array of the
//! guard in `.bss`) shares one page with `.got.plt`. 4 written pages in all;
//! python-tests/test_startup_cost.py counts them. The cost is up to 4 KB of address space
//! before each, never touched.
#![allow(unsafe_code)]

// SAFETY: the two sections hold no bytes and define no symbol: only their alignment
// reaches the linker, and nothing refers to them.
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(test)))]
core::arch::global_asm!(
    ".pushsection .data.rel.ro.rankguard_page,\"awR\",@progbits",
    ".p2align 12",
    ".popsection",
    ".pushsection .data.rankguard_page,\"awR\",@progbits",
    ".p2align 12",
    ".popsection",
);
