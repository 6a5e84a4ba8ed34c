//! The lineage note: what a guarded process's `exec` (or `posix_spawn`) tells the program it
//! starts about that program's guarded ancestors, so that the rank root's walk
//! ([`crate::rank_root::find_with`]) need not read each one's `/proc/<pid>/stat` and
//! `/proc/<pid>/environ` (docs/design.md §1, "The lineage note").
//!
//! The note is one variable of the new program's *initial* environment,
//! `RANKGUARD_LINEAGE=<uid>/<members>[^<pid>]`, written by the guard in the process that
//! calls `exec`, from facts it holds in its own memory:
//! - each member is an ancestor, innermost (the new program's parent) first:
//!   `<pid>.<start>.u` (not guarded: the walk ends there), `<pid>.<start>.g` (guarded, no
//!   `CUDA_VISIBLE_DEVICES` in its initial environment) or `<pid>.<start>.c<hex>` (guarded,
//!   with that initial `CUDA_VISIBLE_DEVICES`, its bytes in hex);
//! - a note ends with an unguarded member (the chain is complete) or with `^<pid>`: the
//!   parent of the last member, where the walk goes on reading `/proc` as before;
//! - `<uid>` is the effective uid of the writer (the walk stops at another user's process).
//!
//! Why it can be trusted as far as the walk trusted `/proc`: the first member must be the
//! reader's parent (its ppid) and have started before it; a note inherited by a program
//! started some other way (a raw `execve`, a note copied by the program into a child's
//! environment) names its writer's parent, not the reader's, and is ignored. A program that
//! forges one on purpose can as well start a process without the guard, which the walk
//! already treats as outside every rank.
//!
//! Everything here is pure and allocation-free but [`Member::cvd`]: the writer runs in an
//! `exec` hook, possibly in a `vfork` child, where nothing may be allocated.

/// The variable's name.
pub const VAR: &str = "RANKGUARD_LINEAGE";

/// The longest note (the value's bytes) a writer renders or a reader accepts: 64 members of
/// a plain chain fit (a member is about 40 bytes without a CVD); one that does not fit is
/// not written, and the walk reads `/proc` instead.
pub const MAX_VALUE: usize = 3 << 10;

/// The longest `CUDA_VISIBLE_DEVICES` value a member carries (in hex, twice as long): eight
/// full UUIDs fit; a longer one makes no note.
pub const MAX_CVD: usize = 384;

/// One ancestor, as a note names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    pub pid: u32,
    pub start: u64,
    /// Its initial `LD_PRELOAD` names the guard.
    pub guarded: bool,
    /// Its initial `CUDA_VISIBLE_DEVICES`, in hex (guarded members only).
    cvd_hex: Option<&'a [u8]>,
}

impl<'a> Member<'a> {
    /// A member from its facts: the raw bytes of the first `CUDA_VISIBLE_DEVICES` definition
    /// of its initial environment (None: unset). Rendered in hex by [`Out::member`].
    pub fn raw(pid: u32, start: u64, guarded: bool, cvd: Option<&'a [u8]>) -> RawMember<'a> {
        RawMember {
            pid,
            start,
            guarded,
            cvd,
        }
    }

    /// Its initial `CUDA_VISIBLE_DEVICES` as the walk's environment scan gives it (None:
    /// unset, or not UTF-8, as [`crate::rank_root::EnvScan`] reads it).
    pub fn cvd(&self) -> Option<String> {
        let hex = self.cvd_hex?;
        let bytes: Vec<u8> = hex
            .chunks_exact(2)
            .map(|p| match p {
                [hi, lo] => (nibble(*hi) << 4) | nibble(*lo),
                _ => 0,
            })
            .collect();
        String::from_utf8(bytes).ok()
    }
}

/// A member's facts before rendering (the writer's side).
#[derive(Clone, Copy, Debug)]
pub struct RawMember<'a> {
    pid: u32,
    start: u64,
    guarded: bool,
    cvd: Option<&'a [u8]>,
}

fn hex_digit(n: u8) -> u8 {
    if n < 10 {
        b'0' + n
    } else {
        b'a' + n - 10
    }
}

fn nibble(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => 0,
    }
}

/// A parsed note: every member already checked to be well formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note<'a> {
    /// The writer's effective uid.
    pub uid: u32,
    /// The members' text, `,`-separated.
    body: &'a [u8],
    /// Where the walk goes on above the last member (None: the last member is unguarded).
    pub above: Option<u32>,
}

impl<'a> Note<'a> {
    /// The members, innermost first.
    pub fn members(&self) -> impl Iterator<Item = Member<'a>> + 'a {
        self.body.split(|&b| b == b',').filter_map(member)
    }

    /// The first member (the parent of the note's reader).
    pub fn first(&self) -> Option<Member<'a>> {
        self.members().next()
    }
}

/// Parse a note's value (the bytes after `RANKGUARD_LINEAGE=`). None for anything not
/// exactly of the form above: an empty chain, a member out of form, an unguarded member
/// anywhere but last, both an unguarded last member and `^`, or neither.
pub fn parse(value: &[u8]) -> Option<Note<'_>> {
    if value.len() > MAX_VALUE {
        return None;
    }
    let (uid, rest) = split_once(value, b'/')?;
    let uid = u32::try_from(decimal(uid)?).ok()?;
    let (body, above) = match split_once(rest, b'^') {
        Some((body, above)) => (
            body,
            Some(u32::try_from(decimal(above)?).ok().filter(|&p| p > 0)?),
        ),
        None => (rest, None),
    };
    let mut last_unguarded = None;
    let mut count = 0usize;
    for text in body.split(|&b| b == b',') {
        let m = member(text)?;
        if last_unguarded == Some(true) {
            return None; // an unguarded member ends the chain
        }
        last_unguarded = Some(!m.guarded);
        count += 1;
    }
    // Complete (ends unguarded) or open (`^`), exactly one of the two; never empty.
    if count == 0 || last_unguarded? == above.is_some() {
        return None;
    }
    Some(Note { uid, body, above })
}

/// `s` split at its first `sep` (`get`, not an index: no panic location, which is a
/// relocation at every start, python-tests/test_startup_cost.py).
fn split_once(s: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|&b| b == sep)?;
    Some((s.get(..i)?, s.get(i + 1..)?))
}

/// A plain decimal of 1 to 20 digits.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

fn member(text: &[u8]) -> Option<Member<'_>> {
    let (pid, rest) = split_once(text, b'.')?;
    let (start, kind) = split_once(rest, b'.')?;
    let pid = u32::try_from(decimal(pid)?)
        .ok()
        .filter(|p| (1..=1 << 22).contains(p))?;
    let start = decimal(start)?;
    let (&k, hex) = kind.split_first()?;
    let (guarded, cvd_hex) = match k {
        b'u' if hex.is_empty() => (false, None),
        b'g' if hex.is_empty() => (true, None),
        b'c' if hex.len() % 2 == 0
            && hex.len() <= 2 * MAX_CVD
            && hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            (true, Some(hex))
        }
        _ => return None,
    };
    Some(Member {
        pid,
        start,
        guarded,
        cvd_hex,
    })
}

/// Renders a note into a fixed buffer, NUL-terminated (an environment entry), allocating
/// nothing; any write past the buffer marks it failed.
pub struct Out<'b> {
    buf: &'b mut [u8],
    len: usize,
    failed: bool,
}

impl<'b> Out<'b> {
    /// A note of the writer's effective uid, started in `buf` (`RANKGUARD_LINEAGE=<uid>/`).
    pub fn new(buf: &'b mut [u8], uid: u32) -> Out<'b> {
        let mut out = Out {
            buf,
            len: 0,
            failed: false,
        };
        out.push(VAR.as_bytes());
        out.push(b"=");
        out.decimal(u64::from(uid));
        out.push(b"/");
        out
    }

    fn push(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(to) => {
                to.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.failed = true,
        }
    }

    fn decimal(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        while let Some(d) = i.checked_sub(1).and_then(|j| digits.get_mut(j)) {
            *d = b'0' + (n % 10) as u8;
            i -= 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or_default());
    }

    /// The first member (the new program's parent).
    pub fn member(&mut self, m: RawMember<'_>) {
        self.decimal(u64::from(m.pid));
        self.push(b".");
        self.decimal(m.start);
        match (m.guarded, m.cvd) {
            (false, _) => self.push(b".u"),
            (true, None) => self.push(b".g"),
            (true, Some(cvd)) if cvd.len() <= MAX_CVD => {
                self.push(b".c");
                for &b in cvd {
                    self.push(&[hex_digit(b >> 4), hex_digit(b & 15)]);
                }
            }
            (true, Some(_)) => self.failed = true,
        }
    }

    /// The rest of the chain: the members of the note the parent was started with (valid
    /// for it), after a `,`, with its end.
    pub fn tail(&mut self, parent: &Note<'_>) {
        self.push(b",");
        self.chain(parent);
    }

    /// The whole of `note` as this note's chain (an `exec` that keeps the process, and so
    /// its ancestors).
    pub fn chain(&mut self, note: &Note<'_>) {
        self.push(note.body);
        if let Some(above) = note.above {
            self.above(above);
        }
    }

    #[cfg(test)]
    pub(crate) fn push_comma_for_tests(&mut self) {
        self.push(b",");
    }

    /// The chain is open: the walk goes on at `pid`, the last member's parent.
    pub fn above(&mut self, pid: u32) {
        self.push(b"^");
        self.decimal(u64::from(pid));
    }

    /// The entry `RANKGUARD_LINEAGE=...` with its NUL, or None when it did not fit or is
    /// longer than a reader accepts.
    pub fn finish(mut self) -> Option<&'b [u8]> {
        self.push(b"\0");
        let value = VAR.len() + 1;
        if self.failed || self.len.saturating_sub(1 + value) > MAX_VALUE {
            return None;
        }
        let Out { buf, len, .. } = self;
        buf.get(..len)
    }
}

/// The first definitions the writer needs of an initial environment (NUL-separated
/// `NAME=value` entries, as the kernel wrote them): `CUDA_VISIBLE_DEVICES`,
/// `LD_PRELOAD` and this note, each the first one (as `getenv` and the walk's
/// [`crate::rank_root::EnvScan`] take it). Found without allocating, entry ends by `nul`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartDefs<'a> {
    pub cvd: Option<&'a [u8]>,
    pub preload: Option<&'a [u8]>,
    pub note: Option<&'a [u8]>,
}

impl StartDefs<'_> {
    /// The environment preloads the guard (the walk's rule, [`crate::rank_root`]).
    pub fn guarded(&self) -> bool {
        self.preload
            .is_some_and(|v| std::str::from_utf8(v).is_ok_and(crate::envbytes::preloads_guard))
    }
}

/// Scan `env` for its [`StartDefs`], stopping once all three are seen.
pub fn start_defs(env: &[u8], nul: crate::envbytes::NulFinder) -> StartDefs<'_> {
    let mut d = StartDefs::default();
    let mut rest = env;
    while !rest.is_empty() && (d.cvd.is_none() || d.preload.is_none() || d.note.is_none()) {
        let (entry, next) = match nul(rest).and_then(|n| Some((rest.get(..n)?, rest.get(n + 1..)?)))
        {
            Some(split) => split,
            None => (rest, &[][..]),
        };
        let def = |name: &[u8]| entry.strip_prefix(name).and_then(|r| r.strip_prefix(b"="));
        if d.cvd.is_none() {
            d.cvd = def(b"CUDA_VISIBLE_DEVICES");
        }
        if d.preload.is_none() {
            d.preload = def(b"LD_PRELOAD");
        }
        if d.note.is_none() {
            d.note = def(VAR.as_bytes());
        }
        rest = next;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(entry: &[u8]) -> &[u8] {
        let e = entry.strip_suffix(b"\0").unwrap();
        e.strip_prefix(b"RANKGUARD_LINEAGE=").unwrap()
    }

    #[test]
    fn a_note_reads_back_as_written() {
        let mut buf = [0u8; 512];
        let mut out = Out::new(&mut buf, 1000);
        out.member(Member::raw(4242, 7_000_123, true, Some(b"GPU-1f2e")));
        out.above(17);
        let entry = out.finish().unwrap();
        assert_eq!(
            entry,
            b"RANKGUARD_LINEAGE=1000/4242.7000123.c4750552d31663265^17\0"
        );
        let note = parse(value(entry)).unwrap();
        assert_eq!(note.uid, 1000);
        assert_eq!(note.above, Some(17));
        let m = note.first().unwrap();
        assert_eq!((m.pid, m.start, m.guarded), (4242, 7_000_123, true));
        assert_eq!(m.cvd().as_deref(), Some("GPU-1f2e"));
        assert_eq!(note.members().count(), 1);

        // A child's note: its parent, then the parent's own note.
        let mut buf2 = [0u8; 512];
        let mut out = Out::new(&mut buf2, 1000);
        out.member(Member::raw(5000, 7_000_200, true, None));
        out.tail(&note);
        let entry = out.finish().unwrap();
        let child = parse(value(entry)).unwrap();
        let got: Vec<_> = child
            .members()
            .map(|m| (m.pid, m.guarded, m.cvd()))
            .collect();
        assert_eq!(
            got,
            vec![(5000, true, None), (4242, true, Some("GPU-1f2e".into()))]
        );
        assert_eq!(child.above, Some(17));
    }

    #[test]
    fn an_unguarded_parent_ends_the_chain() {
        let mut buf = [0u8; 128];
        let mut out = Out::new(&mut buf, 0);
        out.member(Member::raw(9, 1, false, Some(b"0")));
        let entry = out.finish().unwrap();
        assert_eq!(value(entry), b"0/9.1.u");
        let note = parse(value(entry)).unwrap();
        assert_eq!(note.above, None);
        assert_eq!(note.first().unwrap().cvd(), None);
    }

    #[test]
    fn an_empty_or_non_utf8_cvd_is_kept_as_the_scan_reads_it() {
        let mut buf = [0u8; 128];
        let mut out = Out::new(&mut buf, 0);
        out.member(Member::raw(9, 1, true, Some(b"")));
        out.above(1);
        let note = parse(value(out.finish().unwrap())).unwrap();
        assert_eq!(note.first().unwrap().cvd().as_deref(), Some(""));
        let mut buf = [0u8; 128];
        let mut out = Out::new(&mut buf, 0);
        out.member(Member::raw(9, 1, true, Some(b"\xff0")));
        out.above(1);
        let note = parse(value(out.finish().unwrap())).unwrap();
        assert_eq!(note.first().unwrap().cvd(), None);
    }

    #[test]
    fn what_does_not_fit_is_not_written() {
        let mut small = [0u8; 24];
        let mut out = Out::new(&mut small, 1000);
        out.member(Member::raw(4242, 7_000_123, true, None));
        out.above(1);
        assert!(out.finish().is_none());
        let long = vec![b'0'; MAX_CVD + 1];
        let mut buf = [0u8; 2048];
        let mut out = Out::new(&mut buf, 1);
        out.member(Member::raw(2, 1, true, Some(&long)));
        out.above(1);
        assert!(out.finish().is_none());
    }

    #[test]
    fn the_first_definitions_are_the_ones_getenv_returns() {
        let env = b"A=1\0CUDA_VISIBLE_DEVICES=3\0LD_PRELOAD=/x/librankguard.so\0\
                    CUDA_VISIBLE_DEVICES=4\0RANKGUARD_LINEAGE=0/9.1.u\0LD_PRELOAD=\0RANKGUARD_LINEAGE=x";
        let d = start_defs(env, crate::envbytes::first_nul);
        assert_eq!(d.cvd, Some(&b"3"[..]));
        assert_eq!(d.preload, Some(&b"/x/librankguard.so"[..]));
        assert_eq!(d.note, Some(&b"0/9.1.u"[..]));
        assert!(d.guarded());
        // The last entry has no NUL after it (a block's end), names are whole.
        let d = start_defs(
            b"CUDA_VISIBLE_DEVICES_X=1\0LD_PRELOAD=libother.so",
            crate::envbytes::first_nul,
        );
        assert_eq!((d.cvd, d.note), (None, None));
        assert_eq!(d.preload, Some(&b"libother.so"[..]));
        assert!(!d.guarded());
        assert_eq!(
            start_defs(b"", crate::envbytes::first_nul),
            StartDefs::default()
        );
    }

    #[test]
    fn malformed_notes_are_refused() {
        for bad in [
            &b""[..],
            b"1000/",
            b"1000/^5",
            b"x/5.1.g^1",
            b"1000/5.1.g",         // neither complete nor open
            b"1000/5.1.u^1",       // both
            b"1000/5.1.u,6.1.g^1", // an unguarded member before the end
            b"1000/5.1.c4^1",      // odd hex
            b"1000/5.1.cZZ^1",     // not hex
            b"1000/5.1.cAB^1",     // upper case is not what a writer writes
            b"1000/0.1.g^1",       // pid 0
            b"1000/5.1.g^0",
            b"1000/5.1.x^1",
            b"1000/5.1.g,^1",
            b"1000/5..g^1",
            b"1000/5.1.g^1^2",
            b"1000/99999999999999999999999.1.g^1",
        ] {
            assert!(parse(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse(b"1000/5.1.g,6.2.c30,7.3.u").is_some());
        assert!(parse(&vec![b'1'; MAX_VALUE + 1]).is_none());
    }
}
