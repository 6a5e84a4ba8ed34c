//! CPU sets and the kernel's "cpulist" text form (`0-3,8,10-11`).
//!
//! One representation for everything that names CPUs: `--cpu-ids`, sysfs `local_cpulist`
//! and `node*/cpulist`, `/proc/self/status` `Cpus_allowed_list`, and the affinity masks the
//! CLI reads and sets. Pure and safe; the syscalls live in `cli/sys.rs`.
//!
//! Syntax accepted (Documentation/admin-guide/kernel-parameters.rst, "cpu lists"): comma
//! separated ids and inclusive ranges `a-b`, surrounding whitespace and a trailing newline
//! ignored, an empty list is the empty set (sysfs writes an empty `local_cpulist` for a
//! memoryless node). The kernel's stride form `a-b:used/group` is refused with a message
//! rather than guessed at: nothing we read produces it.

use std::collections::BTreeSet;
use std::fmt;

/// Highest CPU id we accept. Linux's CONFIG_NR_CPUS tops out at 8192; a bigger number in
/// user input is a typo, and refusing it keeps a range like `0-4294967295` from allocating.
pub const MAX_CPU: u32 = 8191;

/// A set of CPU ids, kept sorted.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

/// Why a cpulist did not parse; names the offending piece.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub input: String,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid CPU list '{}': {} (expected ids and ranges such as 0-3,8,10-11)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for ParseError {}

impl CpuSet {
    pub fn new() -> CpuSet {
        CpuSet(BTreeSet::new())
    }

    /// Parse a cpulist (`0-3,8`).
    pub fn parse(text: &str) -> Result<CpuSet, ParseError> {
        let err = |reason: String| ParseError {
            input: text.trim().to_string(),
            reason,
        };
        let mut set = BTreeSet::new();
        let body = text.trim();
        if body.is_empty() {
            return Ok(CpuSet(set));
        }
        for item in body.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(err("empty item between commas".into()));
            }
            if item.contains(':') || item.contains('/') {
                return Err(err(format!(
                    "'{item}': the stride form a-b:n/m is not supported"
                )));
            }
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (
                    parse_id(a, item).map_err(err)?,
                    parse_id(b, item).map_err(err)?,
                ),
                None => {
                    let v = parse_id(item, item).map_err(err)?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(err(format!("range '{item}' is reversed")));
            }
            set.extend(lo..=hi);
        }
        Ok(CpuSet(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn insert(&mut self, cpu: u32) {
        self.0.insert(cpu);
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.0.is_disjoint(&other.0)
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    #[cfg_attr(not(test), allow(dead_code))] // set API; the planner's tests use it
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }
}

fn parse_id(text: &str, item: &str) -> Result<u32, String> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{item}' is not a CPU id or range"));
    }
    match t.parse::<u32>() {
        Ok(v) if v <= MAX_CPU => Ok(v),
        _ => Err(format!("CPU id {t} is above the maximum {MAX_CPU}")),
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> CpuSet {
        CpuSet(iter.into_iter().collect())
    }
}

/// The canonical cpulist: ascending, runs of 2+ consecutive ids as ranges (`0-3,8`), the
/// empty set as the empty string. Same as the kernel's `%*pbl`, so it compares equal to
/// `/proc/self/status` `Cpus_allowed_list`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> CpuSet {
        CpuSet::parse(t).unwrap()
    }

    #[test]
    fn parses_ids_and_ranges() {
        assert_eq!(
            s("0-3,8,10-11").iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(s(" 5 \n").iter().collect::<Vec<_>>(), vec![5]);
        assert_eq!(s("3,1,2").to_string(), "1-3");
        assert_eq!(s("0-0").to_string(), "0");
    }

    #[test]
    fn empty_is_the_empty_set() {
        assert!(s("").is_empty());
        assert!(s("\n").is_empty());
        assert_eq!(CpuSet::new().to_string(), "");
    }

    #[test]
    fn formats_like_the_kernel() {
        assert_eq!(s("0,1,2,3,8,10,11").to_string(), "0-3,8,10-11");
        assert_eq!(s("0,2,4").to_string(), "0,2,4");
        assert_eq!(s("7,6").to_string(), "6-7");
    }

    #[test]
    fn round_trips() {
        for t in ["0", "0-1", "0-3,8,10-11", "1,3,5-9,100"] {
            assert_eq!(s(t).to_string(), t);
            assert_eq!(s(&s(t).to_string()), s(t));
        }
    }

    #[test]
    fn refuses_bad_input_with_the_piece_named() {
        for (t, piece) in [
            ("0-", "'0-'"),
            ("a", "'a'"),
            ("1,,2", "empty item"),
            ("3-1", "reversed"),
            ("0-7:2/4", "stride"),
            ("-1", "'-1'"),
            ("99999", "maximum"),
            ("0-4294967295", "maximum"),
        ] {
            let e = CpuSet::parse(t).unwrap_err();
            assert!(e.to_string().contains(piece), "{t}: {e}");
        }
    }

    #[test]
    fn set_operations() {
        let a = s("0-7");
        let b = s("4-11");
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert!(s("1-2").is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(s("0-1").is_disjoint(&s("2-3")));
    }
}
