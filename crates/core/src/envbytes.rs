//! Bytes of an environment block, as the rank root's walk and the lineage note read them:
//! where an entry ends ([`first_nul`], or the guard's faster [`NulFinder`]) and whether an
//! `LD_PRELOAD` value names the guard ([`preloads_guard`]). Below both `rank_root` and
//! `lineage`, which each need them.

/// A function that finds the first NUL of a byte string: the guard hands the scans its own,
/// sixty-four bytes a step with SSE2 (`signal_safe::first_nul`), which this crate cannot
/// write without `unsafe`; it must answer exactly as [`first_nul`] does.
pub type NulFinder = fn(&[u8]) -> Option<usize>;

/// The index of the first NUL in `s`, looked for eight bytes at a time (an environment is
/// mostly values of hundreds of bytes, read whole when the variables come late or not at
/// all), then byte by byte in the word that has it.
pub fn first_nul(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut at = 0;
    for word in s.chunks_exact(8) {
        // (a zeroed word, never used: a chunk of `chunks_exact(8)` is eight bytes)
        let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        // nonzero exactly when a byte of `w` is zero
        if w.wrapping_sub(ONES) & !w & HIGHS != 0 {
            break;
        }
        at += 8;
    }
    // `get`: no index, no panic location (test_startup_cost.py)
    s.get(at..)?.iter().position(|&b| b == 0).map(|n| at + n)
}

/// Whether an `LD_PRELOAD` value names the guard: an entry (separated by `:` or spaces, as
/// ld.so splits them) whose file name starts with `librankguard` (the checkout's
/// `librankguard.so`, or the copy `rankguard lib` writes to its cache).
pub fn preloads_guard(value: &str) -> bool {
    value.split([':', ' ', '\t']).any(|e| {
        e.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with("librankguard"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_nul_is_found_in_any_word() {
        for len in 0..40 {
            let none = vec![b'x'; len];
            assert_eq!(first_nul(&none), None);
            for at in 0..len {
                let mut s = none.clone();
                s[at] = 0;
                if at + 3 < len {
                    s[at + 3] = 0;
                }
                // high bytes next to it must not read as a NUL
                for b in s.iter_mut().take(at) {
                    *b = 0x80 | (*b & 0x7f) ^ 1;
                }
                assert_eq!(first_nul(&s), Some(at), "{len} {at}");
            }
        }
        assert_eq!(first_nul(&[0x01; 16]), None);
        assert_eq!(first_nul(&[0xff; 16]), None);
    }

    #[test]
    fn only_a_librankguard_file_is_the_guard() {
        assert!(preloads_guard("/opt/x/librankguard.so"));
        assert!(preloads_guard("libother.so:/c/librankguard-2.34.so"));
        assert!(!preloads_guard("/x/notlibrankguard.so"));
        assert!(!preloads_guard("/librankguard/libother.so"));
    }
}
