//! The real `dlvsym`, read from the C library's own dynamic symbol table; the driver's
//! functions, from the driver's, when the program links it ([`linked_driver`]).
//!
//! The guard exports `dlvsym` (`dlvsym.rs`), so this library cannot call `dlvsym` by name:
//! the reference binds to its own export (it is linked `-Bsymbolic`, and a preload comes
//! before libc in the global scope anyway). A versioned reference (`dlvsym@GLIBC_2.2.5`,
//! `.symver`) does not help: the loader accepts an unversioned definition for a versioned
//! reference, which is how the guard's own unversioned `dlsym` answers programs'
//! `dlsym@GLIBC_2.34`. So the real `dlvsym` is looked up once, by hand, in the loaded C
//! library's dynamic symbol table: `libc.so.6` (glibc 2.34 and later) or `libdl.so.2`
//! (before), through its GNU hash table (SysV `DT_HASH` where there is none), taking the
//! definition of `dlvsym` that is not hidden (the default version: `dlvsym@@GLIBC_2.34`,
//! before 2.34 `dlvsym@@GLIBC_2.2.5`). This imports no symbol at all, so both library
//! builds (glibc 2.28 floor, 2.34) find it the same way.
//!
//! No allocation and no lock of ours: one `dl_iterate_phdr` walk (the loader's recursive
//! lock, as every `dlvsym` call takes) and reads of mapped memory.
//!
//! The same tables answer for the driver when the program itself was linked with it
//! ([`linked_driver`]): `libcuda.so.1` named by the main program's `DT_NEEDED` is loaded
//! before `main` and can never be unloaded, so its own definitions are what `dlsym` on a
//! handle of it returns, without the `dlopen` that keeps a driver loaded later from going
//! away (docs/design.md §2, "Real functions").
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::guard::sys::loaded;

const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_SONAME: i64 = 14;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
/// Version index flag of a hidden (non-default) definition: `name@VERSION`, not `@@`.
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// The C libraries that define `dlvsym`: libc.so.6 since glibc 2.34, libdl.so.2 before.
fn is_c_library(path: &[u8]) -> bool {
    let base = loaded::basename(path);
    base == b"libc.so.6" || base == b"libdl.so.2"
}

/// GNU hash of a symbol name (`dl_new_hash`).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// SysV ELF hash of a symbol name (`_dl_elf_hash`).
fn sysv_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for &c in name {
        h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        h ^= g >> 24;
        h &= !g;
    }
    h
}

/// One loaded object's dynamic tables, as mapped.
struct Tables {
    base: usize,
    symtab: *const Sym,
    strtab: *const c_char,
    versym: *const u16,
    gnu_hash: *const u32,
    hash: *const u32,
    /// `DT_SONAME`'s offset in the string table (u64::MAX: none).
    soname: u64,
    dynamic: *const Dyn,
}

impl Tables {
    /// The tables named by the dynamic section at `dynamic` of an object loaded at `base`.
    /// glibc relocates the dynamic section's addresses in place on most architectures and
    /// not on others: a value below the base is an offset and gets the base added.
    ///
    /// # Safety
    /// `dynamic` is the mapped `PT_DYNAMIC` of a loaded object, ended by `DT_NULL`.
    unsafe fn read(base: usize, dynamic: *const Dyn) -> Option<Tables> {
        let mut t = Tables {
            base,
            symtab: ptr::null(),
            strtab: ptr::null(),
            versym: ptr::null(),
            gnu_hash: ptr::null(),
            hash: ptr::null(),
            soname: u64::MAX,
            dynamic,
        };
        let at = |v: u64| -> usize {
            let v = v as usize;
            if v < base {
                base.wrapping_add(v)
            } else {
                v
            }
        };
        let mut d = dynamic;
        // A dynamic section has a few dozen entries; the bound only guards against a
        // corrupt one without DT_NULL.
        for _ in 0..4096 {
            // SAFETY: `d` is within the dynamic section, which ends with DT_NULL (the
            // caller's contract); the loop stops there.
            let (tag, val) = unsafe { ((*d).tag, (*d).val) };
            match tag {
                DT_NULL => break,
                DT_SYMTAB => t.symtab = at(val) as *const Sym,
                DT_STRTAB => t.strtab = at(val) as *const c_char,
                DT_VERSYM => t.versym = at(val) as *const u16,
                DT_GNU_HASH => t.gnu_hash = at(val) as *const u32,
                DT_HASH => t.hash = at(val) as *const u32,
                DT_SONAME => t.soname = val,
                _ => {}
            }
            // SAFETY: not past DT_NULL (checked above).
            d = unsafe { d.add(1) };
        }
        (!t.symtab.is_null() && !t.strtab.is_null() && (!t.gnu_hash.is_null() || !t.hash.is_null()))
            .then_some(t)
    }

    /// The string at `offset` of the string table.
    ///
    /// # Safety
    /// `offset` is one the object's dynamic section or symbol table gives.
    unsafe fn string(&self, offset: u64) -> &[u8] {
        // SAFETY: the string table holds NUL-terminated strings at the offsets its object
        // names (the caller's contract); it stays mapped while the object is loaded.
        unsafe { CStr::from_ptr(self.strtab.add(offset as usize)).to_bytes() }
    }

    /// Whether the object's `DT_SONAME` is `name`.
    fn is_named(&self, name: &[u8]) -> bool {
        // SAFETY: DT_SONAME's value is an offset of the object's string table.
        self.soname != u64::MAX && unsafe { self.string(self.soname) } == name
    }

    /// Whether the object names `lib` in a `DT_NEEDED` entry.
    fn needs(&self, lib: &[u8]) -> bool {
        let mut d = self.dynamic;
        for _ in 0..4096 {
            // SAFETY: as in `read`: within the dynamic section, which ends with DT_NULL.
            let (tag, val) = unsafe { ((*d).tag, (*d).val) };
            match tag {
                DT_NULL => return false,
                // SAFETY: DT_NEEDED's value is an offset of the object's string table.
                DT_NEEDED if unsafe { self.string(val) } == lib => return true,
                _ => {}
            }
            // SAFETY: not past DT_NULL (checked above).
            d = unsafe { d.add(1) };
        }
        false
    }

    /// Symbol `i` if it is a defined function named `name`: (address, hidden).
    ///
    /// # Safety
    /// `i` is a symbol index the object's hash table gave.
    unsafe fn candidate(&self, i: usize, name: &[u8]) -> Option<(usize, bool)> {
        // SAFETY: hash tables index the symbol table; names are NUL-terminated strings of
        // the string table; the version table has one entry per symbol.
        unsafe {
            let s = &*self.symtab.add(i);
            if s.shndx == 0 || s.value == 0 || s.info & 0xf != STT_FUNC {
                return None;
            }
            if self.string(u64::from(s.name)) != name {
                return None;
            }
            let hidden =
                !self.versym.is_null() && *self.versym.add(i) & VERSYM_HIDDEN == VERSYM_HIDDEN;
            Some((self.base.wrapping_add(s.value as usize), hidden))
        }
    }

    /// The definition of `name` that is not hidden, else (with `hidden_too`) a hidden one,
    /// else None.
    ///
    /// # Safety
    /// The tables are a loaded object's (read by [`Tables::read`]).
    unsafe fn lookup(&self, name: &[u8], hidden_too: bool) -> Option<usize> {
        let mut fallback = None;
        let mut found = None;
        // SAFETY: the tables are a loaded object's (the caller's contract); `i` is an index
        // its hash table gave.
        unsafe {
            self.each_hashed(name, |i| match self.candidate(i, name) {
                Some((a, false)) => {
                    found = Some(a);
                    true
                }
                Some((a, true)) => {
                    if hidden_too {
                        fallback.get_or_insert(a);
                    }
                    false
                }
                None => false,
            });
        }
        found.or(fallback)
    }

    /// Whether the object defines a symbol named `name`, of any kind or version.
    ///
    /// # Safety
    /// The tables are a loaded object's (read by [`Tables::read`]).
    unsafe fn defines(&self, name: &[u8]) -> bool {
        // SAFETY: as in `lookup`; the symbol table has the entry the hash table gave, and
        // its name is a NUL-terminated string of the string table.
        unsafe {
            self.each_hashed(name, |i| {
                let s = &*self.symtab.add(i);
                s.shndx != 0 && self.string(u64::from(s.name)) == name
            })
        }
    }

    /// Call `pick` with the index of each symbol whose hash is `name`'s, in the hash
    /// table's order, until it returns true; whether one did.
    ///
    /// # Safety
    /// The tables are a loaded object's (read by [`Tables::read`]).
    unsafe fn each_hashed(&self, name: &[u8], mut pick: impl FnMut(usize) -> bool) -> bool {
        // SAFETY: the hash tables' layout is the ELF gABI's (GNU hash: nbuckets, symoffset,
        // bloom size, bloom shift, the bloom words, the buckets, the chains; SysV: nbucket,
        // nchain, the buckets, the chains); every index read is one they give.
        unsafe {
            if !self.gnu_hash.is_null() {
                let g = self.gnu_hash;
                let (nbuckets, symoffset, bloom) =
                    (*g as usize, *g.add(1) as usize, *g.add(2) as usize);
                if nbuckets == 0 {
                    return false;
                }
                let buckets = g.add(4).cast::<usize>().add(bloom).cast::<u32>();
                let chains = buckets.add(nbuckets);
                let h = gnu_hash(name);
                let mut i = *buckets.add(h as usize % nbuckets) as usize;
                if i < symoffset {
                    return false;
                }
                loop {
                    let c = *chains.add(i - symoffset);
                    if c | 1 == h | 1 && pick(i) {
                        return true;
                    }
                    if c & 1 == 1 {
                        return false;
                    }
                    i += 1;
                }
            } else {
                let s = self.hash;
                let (nbucket, nchain) = (*s as usize, *s.add(1) as usize);
                if nbucket == 0 {
                    return false;
                }
                let chains = s.add(2 + nbucket);
                let mut i = *s.add(2 + sysv_hash(name) as usize % nbucket) as usize;
                let mut steps = 0;
                while i != 0 && i < nchain && steps < nchain {
                    if pick(i) {
                        return true;
                    }
                    i = *chains.add(i) as usize;
                    steps += 1;
                }
                false
            }
        }
    }
}

/// The address of the C library's default `dlvsym`, or 0 when no loaded C library defines
/// one (not glibc).
pub fn find_dlvsym() -> usize {
    find_in_c_library(b"dlvsym")
}

/// The default definition of function `name` in the loaded C library (libc.so.6, else
/// libdl.so.2), or 0.
fn find_in_c_library(name: &'static [u8]) -> usize {
    let mut found = 0;
    loaded::each(|info, path| {
        if !is_c_library(path.to_bytes()) {
            return false;
        }
        let Some((base, dynamic)) = dynamic_of(info) else {
            return false;
        };
        // SAFETY: `dynamic` is this loaded object's mapped PT_DYNAMIC, ended by DT_NULL; its
        // tables stay mapped while the object is loaded (for the whole walk).
        let tables = unsafe { Tables::read(base, dynamic as *const Dyn) };
        // SAFETY: the tables are this loaded object's, read just above.
        if let Some(a) = tables.and_then(|t| unsafe { t.lookup(name, true) }) {
            found = a;
            return true;
        }
        false
    });
    found
}

/// The driver library's name, as programs link it and the guard opens it.
const DRIVER: &[u8] = b"libcuda.so.1";

/// What the walk of the loaded objects found (`linked_walk`): [`WALK_NOT_YET`], or
/// [`NOT_LINKED`], or [`LINKED`] with [`OURS_FIRST`] where it applies, then the driver's
/// load base and dynamic section.
static LINKED_STATE: AtomicUsize = AtomicUsize::new(WALK_NOT_YET);
static LINKED_BASE: AtomicUsize = AtomicUsize::new(0);
static LINKED_DYNAMIC: AtomicUsize = AtomicUsize::new(0);
const WALK_NOT_YET: usize = 0;
const NOT_LINKED: usize = 1;
const LINKED: usize = 2;
/// With [`LINKED`]: the first loaded object that defines `cuInit` is this library.
const OURS_FIRST: usize = 4;

/// The driver's own default definition of function `name`, when the main program was
/// linked with `libcuda.so.1` (its `DT_NEEDED`), else None: then, and for a name the
/// driver does not define as a plain function (an IFUNC, only a hidden version), the
/// caller asks `dlsym` on a handle it opens (`resolve::dl`).
///
/// Why this is `dlsym`'s answer: a handle's lookup searches the object itself first, and
/// the driver defines its entry points itself; the default version is the one an
/// unversioned `dlsym` takes. Why it stays valid: an object the program needs is loaded
/// before `main` and never unloaded, so no `dlopen` reference is needed to keep it.
pub fn linked_driver(name: &CStr) -> Option<usize> {
    let (state, base, dynamic) = linked_walk();
    if state & LINKED == 0 {
        return None;
    }
    // SAFETY: `dynamic` is the linked driver's mapped PT_DYNAMIC (found by the walk), which
    // stays mapped for the life of the process (a dependency of the main program).
    let t = unsafe { Tables::read(base, dynamic as *const Dyn) }?;
    // SAFETY: the tables are the loaded driver's, read just above.
    unsafe { t.lookup(name.to_bytes(), false) }
}

/// Whether the program's own lookup of `cuInit` (the global scope's) finds this library's,
/// known without a lookup: the program was linked with the driver, and the first loaded
/// object that defines a `cuInit` at all is this library. The global scope holds the
/// objects loaded before `main` first, in the loader's order, which is the order of its
/// list; the driver the program needs is one of them, so this library, listed before it,
/// is one too (preloaded, or needed by the program), and its `cuInit` is what a lookup
/// finds first. False says nothing: the caller asks the loader (`state::interposing`).
pub fn ours_first_in_global_scope() -> bool {
    linked_walk().0 == LINKED | OURS_FIRST
}

/// The walk's answer, walking on first use: (state, driver base, driver dynamic section).
fn linked_walk() -> (usize, usize, usize) {
    let state = LINKED_STATE.load(Ordering::Acquire);
    if state != WALK_NOT_YET {
        return (
            state,
            LINKED_BASE.load(Ordering::Relaxed),
            LINKED_DYNAMIC.load(Ordering::Relaxed),
        );
    }
    let (state, base, dynamic) = match find_linked(DRIVER, b"cuInit") {
        Some(l) => (
            LINKED | if l.ours_first { OURS_FIRST } else { 0 },
            l.base,
            l.dynamic,
        ),
        None => (NOT_LINKED, 0, 0),
    };
    // Two threads that race here find the same answer: either thread's stores are right,
    // and the state is stored last.
    LINKED_BASE.store(base, Ordering::Relaxed);
    LINKED_DYNAMIC.store(dynamic, Ordering::Relaxed);
    LINKED_STATE.store(state, Ordering::Release);
    (state, base, dynamic)
}

/// A library the main program needs, as [`find_linked`] found it.
struct Linked {
    base: usize,
    dynamic: usize,
    /// The first loaded object that defines the symbol asked for is this library.
    ours_first: bool,
}

/// One walk of the loaded objects: the main program (the loader's first object) must need
/// `lib`, and exactly one loaded object must be it (by `DT_SONAME`, else by file name):
/// its base and dynamic section, and whether the first object (in the loader's order) that
/// defines `symbol` at all is this library.
fn find_linked(lib: &[u8], symbol: &[u8]) -> Option<Linked> {
    // An address in this library: its object is the one whose segments hold it.
    let own = find_linked as *const () as usize;
    let (mut first, mut linked, mut found, mut count) = (true, false, (0, 0), 0);
    let mut first_definer: Option<bool> = None;
    loaded::each(|info, path| {
        let main = std::mem::replace(&mut first, false);
        let tables = dynamic_of(info).and_then(|(base, dynamic)| {
            // SAFETY: `dynamic` is this loaded object's mapped PT_DYNAMIC, ended by DT_NULL.
            unsafe { Tables::read(base, dynamic as *const Dyn) }.map(|t| (t, base, dynamic))
        });
        if main {
            linked = tables.as_ref().is_some_and(|(t, _, _)| t.needs(lib));
            if !linked {
                // Not linked with it: nothing more to look for.
                return true;
            }
        }
        let Some((t, base, dynamic)) = tables else {
            return false;
        };
        // SAFETY: the tables are this loaded object's, read just above.
        if first_definer.is_none() && unsafe { t.defines(symbol) } {
            first_definer = Some(holds(info, own));
        }
        if main {
            return false;
        }
        let named = if t.soname != u64::MAX {
            t.is_named(lib)
        } else {
            loaded::basename(path.to_bytes()) == lib
        };
        if named {
            found = (base, dynamic);
            count += 1;
        }
        false
    });
    (linked && count == 1).then_some(Linked {
        base: found.0,
        dynamic: found.1,
        ours_first: first_definer == Some(true),
    })
}

/// Whether one of the object's loaded segments holds `addr`.
fn holds(info: &libc::dl_phdr_info, addr: usize) -> bool {
    (0..usize::from(info.dlpi_phnum)).any(|i| {
        // SAFETY: as in `dynamic_of`: the loader's program headers of a mapped object.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
        ph.p_type == libc::PT_LOAD && (lo..lo.wrapping_add(ph.p_memsz as usize)).contains(&addr)
    })
}

/// A loaded object's (base, dynamic section address), if it has a PT_DYNAMIC.
fn dynamic_of(info: &libc::dl_phdr_info) -> Option<(usize, usize)> {
    (0..usize::from(info.dlpi_phnum)).find_map(|i| {
        // SAFETY: the loader's record describes the mapped object: `dlpi_phnum` program
        // headers at `dlpi_phdr`, valid for the walk.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        (ph.p_type == libc::PT_DYNAMIC).then(|| {
            let base = info.dlpi_addr as usize;
            (base, base.wrapping_add(ph.p_vaddr as usize))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the C library itself answers for its own `dlvsym` (asked through `dlvsym`: the
    /// test binary does not export one) is what the table walk finds.
    #[test]
    fn finds_the_c_librarys_own_dlvsym() {
        let found = find_dlvsym();
        assert_ne!(found, 0);
        let mut named = false;
        for v in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: NUL-terminated strings; the test binary does not export dlvsym.
            let p = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, c"dlvsym".as_ptr(), v.as_ptr()) };
            named |= p as usize == found;
        }
        assert!(
            named,
            "{found:#x} is none of the C library's dlvsym versions"
        );
        // A function of the C library (not one of the dl* family) is found the same way.
        let getpid = find_in_c_library(b"getpid");
        assert_eq!(getpid, libc::getpid as *const () as usize);
        assert_eq!(find_in_c_library(b"no_such_function_here"), 0);
    }

    /// The walk behind the linked driver, asked of the C library (which this test binary
    /// needs, as a program needs the driver it was linked with): it is found, a function
    /// looked up in its table is the one the loader bound, and the first object defining a
    /// C library function is not this one.
    #[test]
    fn a_library_the_program_needs_is_found_by_one_walk() {
        let l = find_linked(b"libc.so.6", b"getpid").expect("the test binary needs libc.so.6");
        assert!(!l.ours_first);
        // SAFETY: the walk found libc's mapped dynamic section; libc stays loaded.
        let t = unsafe { Tables::read(l.base, l.dynamic as *const Dyn) }.unwrap();
        assert!(t.is_named(b"libc.so.6"));
        // SAFETY: the tables are libc's, read above.
        unsafe {
            assert_eq!(
                t.lookup(b"getpid", false),
                Some(libc::getpid as *const () as usize)
            );
            assert!(t.defines(b"getpid") && !t.defines(b"no_such_function_here"));
            assert_eq!(t.lookup(b"no_such_function_here", false), None);
        }
        // Not needed by the program (its name is no DT_NEEDED of the test binary), or not
        // loaded at all: nothing.
        assert!(find_linked(b"libcuda.so.1", b"cuInit").is_none());
        assert!(find_linked(b"libc.so.6.bak", b"getpid").is_none());
    }

    #[test]
    fn hashes_match_the_gabi_examples() {
        // dl_new_hash("") and the ELF gABI's elf_hash("printf").
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
        assert!(is_c_library(b"/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_c_library(b"libdl.so.2"));
        assert!(!is_c_library(b"libc.so.6.bak") && !is_c_library(b"libcuda.so.1"));
    }
}
