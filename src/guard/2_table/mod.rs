//! The one declarative table of guarded functions.
//!
//! `generated.rs` (written by `scripts/gen_guarded.py`) lists every guarded ABI symbol (a
//! runtime one once per major); `guarded_table!` makes of it its entry in [`TABLE`]: ABI
//! name, the API name programs call it by, library, runtime major, the slot of the real
//! function, the wrapper's address. The wrappers themselves are the entry layer's
//! (`hooks::wrappers`, from the same spec and headers, in the same order); this layer knows
//! them only by the offsets the linker computes.
//!
//! The table holds no pointers: the names are offsets into one string ([`NAMES`]), the
//! wrappers' addresses offsets the linker computes (`rankguard_wrapper_offsets`). Every
//! pointer in a static of a shared library is a relocation the loader applies at every
//! process start, and this library is loaded into every process of a rank, CUDA or not
//! (docs/benchmarks.md, figure 3): as pointers, the table and its indexes cost ~980 of them.
//!
//! Every interposition layer (exported symbols, `dlsym`, `cuGetProcAddress`,
//! `cudaGetDriverEntryPoint`) derives from [`TABLE`]; nothing is listed twice.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64};

use crate::guard::sys::lifecycle::PerProcess;

/// Which library a guarded function belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Driver,
    Runtime,
}

/// One guarded ABI symbol: what is known of it at build time. [`TABLE`] holds no atomics,
/// so it is read-only data; what changes at run time is its [`Slot`] in [`SLOTS`], all zero
/// at load, so in `.bss`. A table of both lay in `.data` (7.4 KB of it), whose pages the
/// loader writes when they carry a relocation (docs/benchmarks.md, "Written pages").
pub struct Entry {
    pub lib: Lib,
    /// The runtime major whose parameters this wrapper has (0 for the driver, whose ABI
    /// symbols never change meaning).
    pub major: u8,
    /// Whether this symbol has the same parameters in every wrapped runtime major (always
    /// for the driver): only then may its wrapper call a runtime of another major.
    pub same_everywhere: bool,
    /// This entry's index in [`TABLE`]: its ABI name is piece `2 * id` of [`NAMES`], its API
    /// name piece `2 * id + 1`, its wrapper's address entry `id` of the wrapper offsets.
    id: u16,
}

/// An entry's run-time state (see [`Entry`]).
pub struct Slot {
    /// The real function as the wrappers' hot path reads it: published once resolved and,
    /// for a driver function, once the R1 check has decided (null until then, so a call
    /// before the verdict takes the cold path and waits there: `real::get`).
    pub real: AtomicPtr<c_void>,
    /// The real function once found (routing compares with it, the guard's own queries
    /// call it), published or not.
    pub found: AtomicPtr<c_void>,
    /// This symbol's first violation was said on stderr in this process: later ones go to
    /// the audit file and the debug log only, so a loop cannot flood the terminal; a forked
    /// child says its own first one.
    pub said: PerProcess,
    /// Ordinals (0..63) whose queries were already recorded in warn mode.
    pub queried: AtomicU64,
}

impl Slot {
    #[allow(clippy::declare_interior_mutable_const)]
    pub const ZERO: Slot = Slot {
        real: AtomicPtr::new(std::ptr::null_mut()),
        found: AtomicPtr::new(std::ptr::null_mut()),
        said: PerProcess::new(),
        queried: AtomicU64::new(0),
    };
}

impl Entry {
    pub const fn new(lib: Lib, major: u8, same_everywhere: bool, id: usize) -> Entry {
        assert!(id < u16::MAX as usize, "the table outgrew its u16 ids");
        Entry {
            lib,
            major,
            same_everywhere,
            id: id as u16,
        }
    }

    /// This entry's run-time state.
    #[inline(always)]
    pub fn slot(&self) -> &'static Slot {
        &SLOTS[self.id as usize]
    }

    /// The real function once found (null until then; see [`Slot::found`]).
    #[inline(always)]
    pub fn found(&self) -> &'static AtomicPtr<c_void> {
        &self.slot().found
    }

    /// Piece `j` of [`NAMES`], with its NUL (empty if out of range: never, the macro
    /// writes two pieces per entry).
    fn piece(j: usize) -> &'static [u8] {
        match (NAME_AT.get(j), NAME_AT.get(j + 1)) {
            (Some(&a), Some(&b)) => NAMES.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Piece `j` without its NUL.
    fn piece_bytes(j: usize) -> &'static [u8] {
        let p = Self::piece(j);
        p.split_last().map_or(p, |(_, name)| name)
    }

    /// Piece `j` without its NUL, as text (the names are Rust identifiers: ASCII).
    fn piece_str(j: usize) -> &'static str {
        std::str::from_utf8(Self::piece_bytes(j)).unwrap_or("")
    }

    /// The ABI name without its NUL.
    pub fn abi(&self) -> &'static str {
        Self::piece_str(2 * self.id as usize)
    }

    /// The ABI name's bytes without its NUL (the binary searches' key: no UTF-8 check).
    pub fn abi_bytes(&self) -> &'static [u8] {
        Self::piece_bytes(2 * self.id as usize)
    }

    /// The API name's bytes (`cuGetProcAddress` routing's key).
    pub fn call_bytes(&self) -> &'static [u8] {
        Self::piece_bytes(2 * self.id as usize + 1)
    }

    /// The API name programs write (`cuCtxCreate` for `cuCtxCreate_v2`): the name
    /// `cuGetProcAddress` is asked for, and the `call` of reports.
    pub fn call(&self) -> &'static str {
        Self::piece_str(2 * self.id as usize + 1)
    }

    pub fn abi_cstr(&self) -> &'static CStr {
        // The macro appends exactly one NUL and Rust identifiers contain none.
        match CStr::from_bytes_with_nul(Self::piece(2 * self.id as usize)) {
            Ok(c) => c,
            Err(_) => c"",
        }
    }

    /// True the first time this process says something about this symbol.
    pub fn first_said(&self, pid: u32) -> bool {
        self.slot().said.first_in(pid)
    }

    /// The exported wrapper's address: the offsets' own address plus this entry's offset.
    pub fn wrapper(&self) -> *const c_void {
        let base = (&raw const WRAPPER_OFFSETS).cast::<u8>();
        // SAFETY: WRAPPER_OFFSETS is an immutable `.rodata` table of COUNT entries (the
        // macro writes one per entry, in TABLE's order, and the assembler fails on a
        // missing one) that the linker filled in before the library was loaded.
        let off = unsafe { WRAPPER_OFFSETS.get(self.id as usize).copied() };
        match off {
            Some(off) => base.wrapping_offset(off as isize).cast(),
            None => std::ptr::null(),
        }
    }
}

/// True if `p` is one of the wrappers' addresses: its offset from the wrapper offsets' own
/// address is one of them (one compare per entry, as when the table held the addresses;
/// `route` asks it for every pointer `cuGetProcAddress` returns).
pub fn is_wrapper(p: *const c_void) -> bool {
    let base = (&raw const WRAPPER_OFFSETS) as usize;
    let Ok(off) = i32::try_from((p as usize).wrapping_sub(base) as isize) else {
        return false;
    };
    // SAFETY: as in `Entry::wrapper`: an immutable table the linker filled in.
    unsafe { WRAPPER_OFFSETS.contains(&off) }
}

unsafe extern "C" {
    /// Entry `i` is the address of entry `i`'s wrapper minus this table's own address
    /// (`hooks::wrappers`' `guarded!`, its `global_asm!`: the linker computes each difference, so the loader has
    /// nothing to relocate). Hidden: only this library refers to it.
    #[link_name = "rankguard_wrapper_offsets"]
    static WRAPPER_OFFSETS: [i32; COUNT];
}

/// `s`'s bytes as an array (`guarded!`'s [`NAMES`]: a static array, so one copy, addressed
/// relative to the code).
pub const fn bytes<const N: usize>(s: &str) -> [u8; N] {
    let b = s.as_bytes();
    assert!(b.len() == N);
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = b[i];
        i += 1;
    }
    out
}

/// Where each NUL-terminated piece of `s` starts, and `s.len()` last (`K` = pieces + 1).
pub const fn piece_starts<const K: usize>(s: &[u8]) -> [u32; K] {
    let mut out = [0u32; K];
    let mut k = 1;
    let mut i = 0;
    while i < s.len() {
        if s[i] == 0 {
            assert!(k < K, "more NUL-terminated names than entries");
            out[k] = (i + 1) as u32;
            k += 1;
        }
        i += 1;
    }
    assert!(k == K, "fewer NUL-terminated names than entries");
    out
}

/// Whether a name can be a guarded one, from its first bytes alone: every guarded ABI name
/// is `cu<Upper>...` (driver) or `cuda<Upper>...` (runtime), so `curl_*`, `cudnn*`,
/// `cublas*` and all other names are rejected by their first five bytes, without
/// `strlen` (the `dlsym` hot path). `at(i)` is the name's byte i; it is only asked for byte
/// i when bytes 0..i matched (and so are not NUL).
#[inline(always)]
pub fn guarded_shape(at: impl Fn(usize) -> u8) -> bool {
    at(0) == b'c'
        && at(1) == b'u'
        && (at(2).is_ascii_uppercase()
            || (at(2) == b'd' && at(3) == b'a' && at(4).is_ascii_uppercase()))
}

/// The entries whose ABI name is `name` (a runtime name: one per wrapped major, in major
/// order), empty if none: binary searches of the generated, sorted [`BY_ABI`].
pub fn abi_entries(name: &[u8]) -> &'static [u16] {
    let abi = |id: u16| TABLE.get(id as usize).map_or(&[][..], Entry::abi_bytes);
    let lo = BY_ABI.partition_point(|&id| abi(id) < name);
    let hi = lo + BY_ABI[lo..].partition_point(|&id| abi(id) == name);
    &BY_ABI[lo..hi]
}

/// The first entry whose ABI name is `name` (the driver's only one).
pub fn find_abi(name: &[u8]) -> Option<usize> {
    abi_entries(name).first().map(|&id| id as usize)
}

/// The entries of every ABI variant of the guarded driver API `name` (`cuCtxCreate`:
/// bare, `_v2`, `_v3`, `_v4`), or None when `name` is not a guarded driver API: a binary
/// search of the generated, sorted [`DRIVER_APIS`].
pub fn driver_variants(name: &[u8]) -> Option<&'static [u16]> {
    let variants = |&(start, len): &(u16, u16)| {
        DRIVER_VARIANTS
            .get(start as usize..start as usize + len as usize)
            .unwrap_or(&[])
    };
    let api = |v: &[u16]| {
        v.first()
            .and_then(|&id| TABLE.get(id as usize))
            .map_or(&[][..], Entry::call_bytes)
    };
    DRIVER_APIS
        .binary_search_by(|a| api(variants(a)).cmp(name))
        .ok()
        .map(|i| variants(&DRIVER_APIS[i]))
}

/// Builds [`TABLE`] from the items of the generated `generated.rs`, one per ABI symbol and
/// (runtime) major, in the order of the wrappers' own generated list (`hooks::wrappers`):
/// `Driver 0 "cuCtxCreate" "cuCtxCreate_v2" same true cuCtxCreate_v2;`
/// `Runtime 13 "cudaSetDevice" "cudaSetDevice" same true cudaSetDevice_cu13;`
/// `same` says whether the symbol's parameters are the same in every wrapped major.
macro_rules! guarded_table {
    ($( $lib:ident $major:literal $call:literal $abi:literal same $same:literal $sym:ident ; )*) => {
        // Variants are the C names (`cuCtxGetId` ends with the enum's name), runtime ones
        // with their major (`cudaSetDevice_cu13`).
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Id { $( $sym, )* }

        pub const COUNT: usize = [$( stringify!($sym), )*].len();

        pub static TABLE: [Entry; COUNT] = [
            $( Entry::new(Lib::$lib, $major, $same, Id::$sym as usize), )*
        ];
        /// Each entry's run-time state, by index (`Entry::slot`): zero at load (`.bss`).
        pub static SLOTS: [Slot; COUNT] = [Slot::ZERO; COUNT];

        const NAMES_STR: &str = concat!($( $abi, "\0", $call, "\0", )*);
        /// Every entry's ABI name, then its API name, each NUL-terminated, one after the
        /// other in [`TABLE`]'s order (`Entry::abi`, `call`).
        pub static NAMES: [u8; NAMES_STR.len()] = bytes(NAMES_STR);
        /// Where each piece of [`NAMES`] starts, and its length last.
        pub static NAME_AT: [u32; 2 * COUNT + 1] = piece_starts(NAMES_STR.as_bytes());
    };
}

// The entries and indexes: generated from guarded.spec and NVIDIA's headers
// (scripts/gen_guarded.py).
include!("generated.rs");

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated indexes are sorted (binary search needs it) and name every entry.
    #[test]
    fn indexes_are_sorted_and_complete() {
        let abi = |id: u16| TABLE[id as usize].abi();
        assert!(BY_ABI.windows(2).all(|w| abi(w[0]) <= abi(w[1])));
        let api = |&(start, _): &(u16, u16)| TABLE[DRIVER_VARIANTS[start as usize] as usize].call();
        assert!(DRIVER_APIS.windows(2).all(|w| api(&w[0]) < api(&w[1])));
        assert_eq!(
            DRIVER_APIS.iter().map(|&(_, n)| n as usize).sum::<usize>(),
            DRIVER_VARIANTS.len()
        );
        assert_eq!(BY_ABI.len(), TABLE.len());
        for (id, e) in TABLE.iter().enumerate() {
            let all = abi_entries(e.abi().as_bytes());
            assert!(all.iter().any(|&i| i as usize == id), "{}", e.abi());
            assert!(all
                .iter()
                .all(|&i| abi(i) == e.abi() && TABLE[i as usize].lib == e.lib));
            if e.lib == Lib::Driver {
                assert_eq!(all.len(), 1, "{}", e.abi());
                assert_eq!(e.major, 0);
            } else {
                assert!(RUNTIME_MAJORS.contains(&e.major), "{}", e.abi());
                // One per major, in major order.
                assert!(all
                    .windows(2)
                    .all(|w| TABLE[w[0] as usize].major < TABLE[w[1] as usize].major));
            }
            if e.lib == Lib::Driver {
                let vs =
                    driver_variants(e.call().as_bytes()).unwrap_or_else(|| panic!("{}", e.call()));
                assert!(vs.contains(&(id as u16)), "{}", e.abi());
                assert!(vs.iter().all(|&v| TABLE[v as usize].call() == e.call()));
            } else {
                assert!(
                    driver_variants(e.call().as_bytes()).is_none(),
                    "{}",
                    e.call()
                );
            }
        }
        assert_eq!(find_abi(b"cuCtxCreate_v9"), None);
        assert_eq!(find_abi(b""), None);
        assert_eq!(driver_variants(b"cuMemAlloc"), None);
    }

    /// The offsets' own address is no wrapper's (the wrappers' own test, in
    /// `hooks::wrappers`, checks each entry's).
    #[test]
    fn the_offsets_are_no_wrapper() {
        assert!(!is_wrapper((&raw const WRAPPER_OFFSETS).cast()));
        assert!(!is_wrapper(std::ptr::null()));
        assert_eq!(NAMES.last(), Some(&0));
    }

    fn shape(name: &str) -> bool {
        let b = name.as_bytes();
        guarded_shape(|i| b.get(i).copied().unwrap_or(0))
    }

    /// The `dlsym` fast path may only reject names that are not in the table.
    #[test]
    fn every_guarded_name_has_the_guarded_shape() {
        for e in TABLE.iter() {
            assert!(
                shape(e.abi()),
                "{} would be forwarded unguarded by dlsym",
                e.abi()
            );
        }
        for other in [
            "curl_easy_init",
            "cudnnCreate",
            "cublasCreate_v2",
            "cu",
            "c",
            "",
            "cuda",
            "cuda_x",
        ] {
            assert!(!shape(other), "{other}");
        }
    }
}
