//! The real `dlvsym`, read from the C library's own dynamic symbol table.
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
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr};
use std::ptr;

use crate::guard::sys::loaded;

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
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
                _ => {}
            }
            // SAFETY: not past DT_NULL (checked above).
            d = unsafe { d.add(1) };
        }
        (!t.symtab.is_null() && !t.strtab.is_null() && (!t.gnu_hash.is_null() || !t.hash.is_null()))
            .then_some(t)
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
            if CStr::from_ptr(self.strtab.add(s.name as usize)).to_bytes() != name {
                return None;
            }
            let hidden =
                !self.versym.is_null() && *self.versym.add(i) & VERSYM_HIDDEN == VERSYM_HIDDEN;
            Some((self.base.wrapping_add(s.value as usize), hidden))
        }
    }

    /// The definition of `name` that is not hidden, else a hidden one, else None.
    ///
    /// # Safety
    /// The tables are a loaded object's (read by [`Tables::read`]).
    unsafe fn lookup(&self, name: &[u8]) -> Option<usize> {
        let mut fallback = None;
        let mut consider = |c: Option<(usize, bool)>| -> Option<usize> {
            match c {
                Some((a, false)) => Some(a),
                Some((a, true)) => {
                    fallback.get_or_insert(a);
                    None
                }
                None => None,
            }
        };
        // SAFETY: the hash tables' layout is the ELF gABI's (GNU hash: nbuckets, symoffset,
        // bloom size, bloom shift, the bloom words, the buckets, the chains; SysV: nbucket,
        // nchain, the buckets, the chains); every index read is one they give.
        unsafe {
            if !self.gnu_hash.is_null() {
                let g = self.gnu_hash;
                let (nbuckets, symoffset, bloom) =
                    (*g as usize, *g.add(1) as usize, *g.add(2) as usize);
                if nbuckets == 0 {
                    return None;
                }
                let buckets = g.add(4).cast::<usize>().add(bloom).cast::<u32>();
                let chains = buckets.add(nbuckets);
                let h = gnu_hash(name);
                let mut i = *buckets.add(h as usize % nbuckets) as usize;
                if i < symoffset {
                    return None;
                }
                loop {
                    let c = *chains.add(i - symoffset);
                    if c | 1 == h | 1 {
                        if let Some(a) = consider(self.candidate(i, name)) {
                            return Some(a);
                        }
                    }
                    if c & 1 == 1 {
                        break;
                    }
                    i += 1;
                }
            } else {
                let s = self.hash;
                let (nbucket, nchain) = (*s as usize, *s.add(1) as usize);
                if nbucket == 0 {
                    return None;
                }
                let chains = s.add(2 + nbucket);
                let mut i = *s.add(2 + sysv_hash(name) as usize % nbucket) as usize;
                let mut steps = 0;
                while i != 0 && i < nchain && steps < nchain {
                    if let Some(a) = consider(self.candidate(i, name)) {
                        return Some(a);
                    }
                    i = *chains.add(i) as usize;
                    steps += 1;
                }
            }
        }
        fallback
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
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: the loader's record describes the mapped object: `dlpi_phnum` program
            // headers at `dlpi_phdr`, and a PT_DYNAMIC one's tables at `dlpi_addr` + its
            // `p_vaddr`, mapped while the object is loaded (for the whole walk).
            unsafe {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type != libc::PT_DYNAMIC {
                    continue;
                }
                let dynamic = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                if let Some(t) = Tables::read(info.dlpi_addr as usize, dynamic as *const Dyn) {
                    if let Some(a) = t.lookup(name) {
                        found = a;
                        return true;
                    }
                }
            }
        }
        false
    });
    found
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
