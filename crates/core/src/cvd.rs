//! `CUDA_VISIBLE_DEVICES`: what a value means, parsed the way the CUDA driver parses it.
//!
//! Two layers, because a process cannot know the whole node:
//! - [`parse`] applies the rules that need nothing but the text (docs/design.md §3: CUDA
//!   Programming Guide, env vars section; PyTorch `_parse_visible_devices`, checked against
//!   a real driver in pytorch#92315): empty -> none, the first invalid entry truncates, the
//!   first entry's form decides the mode, integers parse like `strtoul` with a sign and
//!   surrounding spaces, `-1` (any negative but `-0`) is invalid, an identical duplicate
//!   empties the whole set.
//! - [`resolve`] adds what needs the node (ordinals beyond the count truncate, UUID
//!   prefixes must match exactly one device, duplicates by identity). The guard and the CLI
//!   ask the driver for this at run time; `resolve` exists so the parser can be checked
//!   against the same vectors as the fake driver (`c-tests/cvd-vectors.tsv`).
//!
//! Pure and safe: no environment access except in [`from_env`].

use std::fmt;

/// The variable's name.
pub const VAR: &str = "CUDA_VISIBLE_DEVICES";

/// One entry of a visible-devices list, as the user wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CvdEntry {
    /// A device ordinal in the parent's enumeration order.
    Index(u32),
    /// `GPU-<uuid>` or a prefix of it (at least `GPU-`), verbatim, trimmed.
    Uuid(String),
    /// `MIG-<uuid>` or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`, verbatim, trimmed.
    Mig(String),
}

impl CvdEntry {
    /// The text to hand to a child's `CUDA_VISIBLE_DEVICES`. UUID entries are preserved
    /// verbatim (a prefix stays the prefix the parent chose); indices are normalised
    /// (`" +3"` -> `"3"`), which is what the driver read them as.
    pub fn text(&self) -> String {
        self.to_string()
    }

    fn kind(&self) -> EntryKind {
        match self {
            CvdEntry::Index(_) => EntryKind::Index,
            CvdEntry::Uuid(_) => EntryKind::Uuid,
            CvdEntry::Mig(_) => EntryKind::Mig,
        }
    }
}

impl fmt::Display for CvdEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CvdEntry::Index(i) => write!(f, "{i}"),
            CvdEntry::Uuid(s) | CvdEntry::Mig(s) => f.write_str(s),
        }
    }
}

/// What a `CUDA_VISIBLE_DEVICES` value makes visible, before the node is consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Not set: every device of the node.
    Unset,
    /// Set: these entries in this order; empty means no device at all.
    Entries(Vec<CvdEntry>),
}

impl Visibility {
    /// The entries, or `None` when the variable is unset (all devices).
    pub fn entries(&self) -> Option<&[CvdEntry]> {
        match self {
            Visibility::Unset => None,
            Visibility::Entries(e) => Some(e),
        }
    }

    /// True when the value deliberately hides every device (empty, `-1`, all invalid).
    pub fn is_none(&self) -> bool {
        matches!(self, Visibility::Entries(e) if e.is_empty())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
/// Which form an entry takes; a list keeps to the form of its first entry.
enum EntryKind {
    Index,
    Uuid,
    Mig,
}

/// Parse a value with CUDA's syntactic rules. `None` is an unset variable.
pub fn parse(value: Option<&str>) -> Visibility {
    let Some(value) = value else {
        return Visibility::Unset;
    };
    let mut entries: Vec<CvdEntry> = Vec::new();
    let mut kind = None;
    for token in value.split(',') {
        let Some(entry) = parse_entry(token) else {
            break;
        };
        // The first entry's form decides the list's; an entry of another form is invalid
        // and truncates the list like any other invalid entry.
        match kind {
            None => kind = Some(entry.kind()),
            Some(m) if m != entry.kind() => break,
            Some(_) => {}
        }
        entries.push(entry);
    }
    if has_duplicate(&entries) {
        // A duplicate makes the whole set empty, not just the second occurrence.
        entries.clear();
    }
    Visibility::Entries(entries)
}

/// Entries of a set value that CUDA does not read, when it still reads some: `0,` and
/// `0,-1` are the single device 0 (docs/design.md §3: the first invalid entry truncates the
/// list). Not a violation (the process sees what the entries read say, one device for
/// `0,-1`), but never what was meant: the guard's R1 check and `rankguard check` both say it
/// with [`Unread::describe`] and both decide R1 on the entries read (issue 29, item 10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unread<'a> {
    /// Entries CUDA reads.
    pub read: usize,
    /// Entries written (comma-separated tokens).
    pub written: usize,
    /// The first entry not read, as written (`""` for a trailing comma).
    pub from: &'a str,
}

impl Unread<'_> {
    /// One sentence naming the value, what CUDA reads and the fix.
    pub fn describe(&self, value: &str) -> String {
        let var = VAR; // a local, not `{VAR}`: see narrow.rs's `let var`
        format!(
            "{var}='{value}': CUDA reads only its first {} of {} entries (it stops at {:?}, \
             which is not a valid entry of this list); the process sees what those name; fix the variable",
            self.read, self.written, self.from
        )
    }
}

/// What of `value` CUDA does not read (see [`Unread`]); None when it reads every entry, or
/// none at all (an empty list: no device, a helper's setting, nothing to warn about).
pub fn unread(value: &str) -> Option<Unread<'_>> {
    let read = parse(Some(value)).entries().map_or(0, <[CvdEntry]>::len);
    let written = value.split(',').count();
    if read == 0 || read >= written {
        return None;
    }
    Some(Unread {
        read,
        written,
        from: value.split(',').nth(read).unwrap_or(""),
    })
}

/// Parse the process's own `CUDA_VISIBLE_DEVICES`. A value that is not UTF-8 cannot name
/// any device (UUIDs and digits are ASCII) and parses as an invalid first entry: none.
pub fn from_env() -> Visibility {
    match std::env::var_os(VAR) {
        None => Visibility::Unset,
        Some(v) => match v.to_str() {
            Some(s) => parse(Some(s)),
            None => Visibility::Entries(Vec::new()),
        },
    }
}

fn has_duplicate(entries: &[CvdEntry]) -> bool {
    entries
        .iter()
        .enumerate()
        .any(|(i, e)| entries.iter().take(i).any(|x| x == e))
}

/// UUID entries are taken verbatim, as the driver matches them (no space stripping: a
/// leading space makes an entry an index, which is then invalid; PyTorch's model of the
/// driver, pytorch#92315, does the same). Indices skip leading spaces like `strtoul`.
fn parse_entry(token: &str) -> Option<CvdEntry> {
    if token.starts_with("GPU-") {
        return Some(CvdEntry::Uuid(token.to_string()));
    }
    if token.starts_with("MIG-") {
        return Some(CvdEntry::Mig(token.to_string()));
    }
    parse_strtoul(token.trim_start_matches(|c: char| c.is_ascii_whitespace())).map(CvdEntry::Index)
}

/// `strtoul`-style: optional sign, decimal digits, anything after the digits ignored
/// (`1gpu2` -> 1). No digits -> invalid. A negative value other than `-0` wraps to a huge
/// number in `strtoul`, which no device has: invalid. Values beyond `u32` likewise.
fn parse_strtoul(t: &str) -> Option<u32> {
    let (negative, rest) = match t.as_bytes().first() {
        // `get`, not `[1..]` (byte 0 is ASCII: a boundary): an index keeps a panic
        // location, a relocation in every process that loads the guard (narrow.rs).
        Some(b'+') => (false, t.get(1..).unwrap_or("")),
        Some(b'-') => (true, t.get(1..).unwrap_or("")),
        _ => (false, t),
    };
    let digits_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits_len == 0 {
        return None;
    }
    let value: u64 = rest.bytes().take(digits_len).try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    if negative && value != 0 {
        return None;
    }
    u32::try_from(value).ok()
}

/// One enumerable device of a node: a whole GPU or a MIG instance of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeDevice {
    /// Physical GPU index (PCI bus order).
    Gpu(usize),
    /// MIG instance `instance` of physical GPU `gpu`.
    Mig { gpu: usize, instance: usize },
}

/// What [`resolve`] needs to know about a node.
pub trait Node {
    /// Devices enumerated when the variable is unset, in enumeration order (a GPU in MIG
    /// mode appears as its instance 0, see [`Node::whole_gpu`]).
    fn default_order(&self) -> Vec<NodeDevice>;
    /// What naming a whole GPU enumerates: the GPU, or its MIG instance 0 when it is in
    /// MIG mode (the fake's decision D-migenum, c-tests/fake/driver/cvd.c).
    fn whole_gpu(&self, gpu: usize) -> NodeDevice;
    /// Every GPU's UUID (`GPU-...`), by physical index.
    fn gpu_uuids(&self) -> Vec<String>;
    /// Every MIG instance with its UUID (`MIG-...`).
    fn mig_uuids(&self) -> Vec<(NodeDevice, String)>;
}

/// Resolve a parsed value against a node: the devices the driver enumerates, in order.
pub fn resolve(vis: &Visibility, node: &dyn Node) -> Vec<NodeDevice> {
    let entries = match vis {
        Visibility::Unset => return node.default_order(),
        Visibility::Entries(e) => e,
    };
    let mut out: Vec<NodeDevice> = Vec::new();
    for entry in entries {
        let found = match entry {
            CvdEntry::Index(i) => node.default_order().get(*i as usize).copied(),
            CvdEntry::Uuid(prefix) => unique_match(
                prefix,
                node.gpu_uuids()
                    .into_iter()
                    .enumerate()
                    .map(|(i, u)| (NodeDevice::Gpu(i), u)),
            )
            .map(|d| match d {
                NodeDevice::Gpu(g) => node.whole_gpu(g),
                other => other,
            }),
            CvdEntry::Mig(text) => resolve_mig(text, node),
        };
        match found {
            Some(d) => {
                if out.contains(&d) {
                    // The same device named twice (e.g. a UUID and its prefix).
                    return Vec::new();
                }
                out.push(d);
            }
            None => break,
        }
    }
    // CUDA enumerates at most one MIG instance per process (NVIDIA MIG User Guide, "CUDA
    // Device Enumeration"): later MIG devices are dropped, later whole GPUs stay.
    let mut seen_mig = false;
    out.retain(|d| match d {
        NodeDevice::Mig { .. } => !std::mem::replace(&mut seen_mig, true),
        NodeDevice::Gpu(_) => true,
    });
    out
}

/// The only candidate whose UUID starts with `prefix`; none or several -> `None`.
fn unique_match(
    prefix: &str,
    candidates: impl Iterator<Item = (NodeDevice, String)>,
) -> Option<NodeDevice> {
    let mut hit = None;
    for (dev, uuid) in candidates {
        if uuid.starts_with(prefix) {
            if hit.is_some() {
                return None;
            }
            hit = Some(dev);
        }
    }
    hit
}

fn resolve_mig(text: &str, node: &dyn Node) -> Option<NodeDevice> {
    // Legacy form: MIG-GPU-<gpu uuid>/<gi>/<ci>; the fake numbers instances by GI with CI 0.
    if let Some(rest) = text.strip_prefix("MIG-GPU-") {
        let mut parts = rest.split('/');
        let gpu_prefix = format!("GPU-{}", parts.next()?);
        let gi: usize = parts.next()?.parse().ok()?;
        let ci: usize = parts.next()?.parse().ok()?;
        if parts.next().is_some() || ci != 0 {
            return None;
        }
        let NodeDevice::Gpu(gpu) = unique_match(
            &gpu_prefix,
            node.gpu_uuids()
                .into_iter()
                .enumerate()
                .map(|(i, u)| (NodeDevice::Gpu(i), u)),
        )?
        else {
            return None;
        };
        let dev = NodeDevice::Mig { gpu, instance: gi };
        return node
            .mig_uuids()
            .iter()
            .any(|(d, _)| *d == dev)
            .then_some(dev);
    }
    unique_match(text, node.mig_uuids().into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(v: &[u32]) -> Visibility {
        Visibility::Entries(v.iter().copied().map(CvdEntry::Index).collect())
    }

    #[test]
    fn syntactic_rules_from_design_section_3() {
        assert_eq!(parse(None), Visibility::Unset);
        assert_eq!(parse(Some("")), idx(&[]));
        assert_eq!(parse(Some("-1")), idx(&[]));
        assert_eq!(parse(Some("0,2,-1,1")), idx(&[0, 2]));
        assert_eq!(parse(Some("1gpu2,2ampere")), idx(&[1, 2]));
        assert_eq!(parse(Some("one,two,3")), idx(&[]));
        assert_eq!(parse(Some("2, +3, -0, 5")), idx(&[2, 3, 0, 5]));
        assert_eq!(parse(Some("0,1,2,1")), idx(&[]));
        assert_eq!(parse(Some("0,,1")), idx(&[0]));
        assert_eq!(parse(Some("99999999999")), idx(&[]));
    }

    #[test]
    fn unread_entries_are_named_and_the_read_ones_decide() {
        // `0,` and `0,-1` are the single device 0: one entry, as R1 asks.
        for v in ["0,", "0,-1", "0,x", "0,GPU-12"] {
            assert_eq!(parse(Some(v)), idx(&[0]), "{v}");
        }
        assert_eq!(
            unread("0,"),
            Some(Unread {
                read: 1,
                written: 2,
                from: ""
            })
        );
        let u = unread("0,-1").unwrap();
        assert_eq!((u.read, u.written, u.from), (1, 2, "-1"));
        assert!(u.describe("0,-1").contains("first 1 of 2 entries"));
        assert_eq!(unread("0,2,-1,1").map(|u| u.read), Some(2));
        // every entry read, or none at all: nothing unread to say
        for v in ["0", "0,1", "", "-1", "-1,0", "0,1,0", "GPU-12"] {
            assert_eq!(unread(v), None, "{v}");
        }
    }

    #[test]
    fn first_entry_decides_the_mode() {
        assert_eq!(
            parse(Some("GPU-12, 3")),
            Visibility::Entries(vec![CvdEntry::Uuid("GPU-12".into())])
        );
        assert_eq!(parse(Some("3,GPU-12")), idx(&[3]));
        assert_eq!(
            parse(Some("MIG-1000a11c,GPU-12")),
            Visibility::Entries(vec![CvdEntry::Mig("MIG-1000a11c".into())])
        );
        // UUID entries are verbatim: a leading space makes the entry an (invalid) index.
        assert_eq!(parse(Some(" GPU-12")), idx(&[]));
    }

    #[test]
    fn uuid_entries_are_kept_verbatim() {
        let v = parse(Some("GPU-12c0ffee-0000-4000-8000-000000000002"));
        assert_eq!(
            v.entries().unwrap()[0].text(),
            "GPU-12c0ffee-0000-4000-8000-000000000002"
        );
        assert_eq!(parse(Some(" +3 ")).entries().unwrap()[0].text(), "3");
    }

    /// The fake node of c-tests/README.md: GPU i has uuid
    /// GPU-{0x10+i:02x}c0ffee-0000-4000-8000-{i:012x}; MIG j on GPU i has
    /// MIG-{0x10+i:02x}{j:02x}a11c-0000-4000-8000-{i*256+j:012x}.
    struct FakeNode {
        gpus: usize,
        mig: Vec<(usize, usize)>,
    }

    impl FakeNode {
        fn parse(gpus: &str, mig: &str) -> FakeNode {
            let gpus = gpus.parse().expect("gpus column");
            let mig = if mig == "-" {
                Vec::new()
            } else {
                mig.split(';')
                    .map(|p| {
                        let (g, n) = p.split_once(':').expect("mig column G:N");
                        (g.parse().unwrap(), n.parse().unwrap())
                    })
                    .collect()
            };
            FakeNode { gpus, mig }
        }
        fn is_mig(&self, gpu: usize) -> bool {
            self.mig.iter().any(|(g, _)| *g == gpu)
        }
    }

    impl Node for FakeNode {
        // FASTEST_FIRST on the fake node (c-tests/fake/driver/cvd.c, D-fastest): whole GPUs
        // are identical (PCI order); a MIG GPU enumerates as its instance 0, whose speed is
        // its slice, 7/N sevenths: slower than any whole GPU, larger slices first.
        fn default_order(&self) -> Vec<NodeDevice> {
            let mut d: Vec<NodeDevice> = (0..self.gpus).map(|g| self.whole_gpu(g)).collect();
            d.sort_by_key(|dev| match dev {
                NodeDevice::Gpu(_) => (0, 0),
                NodeDevice::Mig { gpu, .. } => {
                    let n = self
                        .mig
                        .iter()
                        .find(|(g, _)| g == gpu)
                        .map_or(1, |(_, n)| *n);
                    (1, -((7 / n) as i64))
                }
            });
            d
        }
        fn whole_gpu(&self, gpu: usize) -> NodeDevice {
            if self.is_mig(gpu) {
                NodeDevice::Mig { gpu, instance: 0 }
            } else {
                NodeDevice::Gpu(gpu)
            }
        }
        fn gpu_uuids(&self) -> Vec<String> {
            (0..self.gpus)
                .map(|i| format!("GPU-{:02x}c0ffee-0000-4000-8000-{:012x}", 0x10 + i, i))
                .collect()
        }
        fn mig_uuids(&self) -> Vec<(NodeDevice, String)> {
            let mut out = Vec::new();
            for &(gpu, n) in &self.mig {
                for j in 0..n {
                    out.push((
                        NodeDevice::Mig { gpu, instance: j },
                        format!(
                            "MIG-{:02x}{:02x}a11c-0000-4000-8000-{:012x}",
                            0x10 + gpu,
                            j,
                            gpu * 256 + j
                        ),
                    ));
                }
            }
            out
        }
    }

    fn render(devs: &[NodeDevice]) -> String {
        if devs.is_empty() {
            return "-".into();
        }
        devs.iter()
            .map(|d| match d {
                NodeDevice::Gpu(g) => g.to_string(),
                NodeDevice::Mig { gpu, instance } => format!("{gpu}/{instance}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every row of the vector file shared with the fake driver's conformance suite.
    #[test]
    fn shared_vectors_agree_with_the_fake_driver() {
        let text = include_str!("../../../c-tests/cvd-vectors.tsv");
        let mut cases = 0;
        for (n, line) in text.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(
                cols.len(),
                4,
                "cvd-vectors.tsv line {}: want 4 columns: {line:?}",
                n + 1
            );
            let node = FakeNode::parse(cols[0], cols[1]);
            let value = match cols[2] {
                "<unset>" => None,
                "<empty>" => Some(""),
                v => Some(v),
            };
            let got = render(&resolve(&parse(value), &node));
            assert_eq!(
                got,
                cols[3],
                "cvd-vectors.tsv line {}: CVD={:?}",
                n + 1,
                cols[2]
            );
            cases += 1;
        }
        assert!(cases >= 20, "only {cases} vectors");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn token() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u32..12).prop_map(|i| i.to_string()),
                "[ +-]?[0-9]{1,3}[a-z]{0,2}",
                "GPU-[0-9a-f]{0,6}",
                "MIG-[0-9a-f]{0,6}",
                // one token: anything printable but the separator
                "[ -~]{0,6}".prop_filter("a token holds no comma", |t| !t.contains(',')),
            ]
        }

        proptest! {
            #[test]
            fn arbitrary_strings_never_panic(s in "\\PC{0,40}") {
                let _ = parse(Some(&s));
            }

            #[test]
            fn never_duplicates(tokens in prop::collection::vec(token(), 0..8)) {
                let v = parse(Some(&tokens.join(",")));
                let e = v.entries().unwrap();
                for (i, x) in e.iter().enumerate() {
                    prop_assert!(!e[..i].contains(x));
                }
            }

            /// The result is a prefix of the tokens' own parses, of one mode: truncation,
            /// never reordering, never skipping.
            #[test]
            fn truncation_keeps_a_prefix(tokens in prop::collection::vec(token(), 0..8)) {
                let v = parse(Some(&tokens.join(",")));
                let e = v.entries().unwrap();
                prop_assume!(!e.is_empty());
                for (i, x) in e.iter().enumerate() {
                    prop_assert_eq!(Some(x.clone()), parse_entry(&tokens[i]));
                    prop_assert_eq!(x.kind(), e[0].kind());
                }
                if let Some(next) = tokens.get(e.len()) {
                    // What stopped the list was invalid or of another mode (or the whole set
                    // would have had a duplicate, which empties it instead).
                    match parse_entry(next) {
                        None => {}
                        Some(n) => prop_assert!(n.kind() != e[0].kind()),
                    }
                }
            }

            #[test]
            fn index_entries_roundtrip(v in prop::collection::vec(0u32..1000, 1..6)) {
                let mut seen = std::collections::HashSet::new();
                prop_assume!(v.iter().all(|x| seen.insert(*x)));
                let text: Vec<String> = v.iter().map(|x| format!(" +{x} ")).collect();
                let parsed = parse(Some(&text.join(",")));
                let want: Vec<CvdEntry> = v.iter().copied().map(CvdEntry::Index).collect();
                prop_assert_eq!(parsed, Visibility::Entries(want));
            }
        }
    }
}
