//! A few `&'static str` picked by index at run time without a table of pointers.
//!
//! A `match` that returns one of several string literals (an enum's name) or an array of
//! `&str` that a loop walks compiles to a table of pointers in the library's read-only data,
//! and each pointer is a relative relocation the loader applies at every process start,
//! CUDA or not (~13 loader instructions of every `/bin/true`; docs/benchmarks.md, "What the
//! loader's added instructions are made of"). A [`StrTable`] is the strings joined into one
//! literal, which code reaches by a pc-relative address, and where each ends, integers:
//! nothing to relocate.

/// The strings of `[$s, ...]`, in that order, as a [`StrTable`] (a constant expression).
#[macro_export]
macro_rules! str_table {
    ($($s:literal),+ $(,)?) => {
        $crate::strtab::StrTable {
            text: concat!($($s),+),
            ends: &$crate::strtab::ends(concat!($($s),+), &[$($s),+]),
        }
    };
}

/// `N` strings joined (`text`) and the end of each in it (`ends`, apart: indexed at run
/// time, it is integers only, while the pointer to `text` folds into the code that uses
/// it). Built by [`str_table!`], which checks at compile time that `text` is the strings
/// joined.
#[derive(Clone, Copy, Debug)]
pub struct StrTable<const N: usize> {
    pub text: &'static str,
    pub ends: &'static [u16; N],
}

/// Where each of `parts` ends in `text`, their join (a compile-time error otherwise).
pub const fn ends<const N: usize>(text: &str, parts: &[&str; N]) -> [u16; N] {
    let t = text.as_bytes();
    let mut ends = [0u16; N];
    let (mut at, mut i) = (0, 0);
    while i < N {
        let p = parts[i].as_bytes();
        let mut j = 0;
        while j < p.len() {
            assert!(t[at + j] == p[j], "text is not the parts joined");
            j += 1;
        }
        at += p.len();
        assert!(at <= u16::MAX as usize, "a StrTable holds 64 KiB at most");
        ends[i] = at as u16;
        i += 1;
    }
    assert!(at == t.len(), "text is not the parts joined");
    ends
}

impl<const N: usize> StrTable<N> {
    /// The `i`-th string; "" past the last (never a panic).
    #[inline]
    pub fn get(&self, i: usize) -> &'static str {
        let end = self.ends.get(i).map_or(0, |&e| usize::from(e));
        let start = i
            .checked_sub(1)
            .and_then(|p| self.ends.get(p))
            .map_or(0, |&e| usize::from(e));
        self.text.get(start..end).unwrap_or("")
    }

    /// How many strings.
    pub const fn len(&self) -> usize {
        N
    }

    /// Whether it holds none.
    pub const fn is_empty(&self) -> bool {
        N == 0
    }

    /// The strings, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'static str> + '_ {
        (0..N).map(|i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    const T: super::StrTable<3> = str_table!("one", "", "three");

    #[test]
    fn picks_each_string_and_nothing_past_the_last() {
        assert_eq!(
            (T.get(0), T.get(1), T.get(2), T.get(3)),
            ("one", "", "three", "")
        );
        assert_eq!(T.iter().collect::<Vec<_>>(), ["one", "", "three"]);
        assert_eq!(T.len(), 3);
    }
}
