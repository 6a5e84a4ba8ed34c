//! The audit record: one typed value per decision the guard reports, built once and
//! rendered twice — as the human line on stderr ([`AuditRecord::write_line`]) and as one
//! JSON object per line in `RANKGUARD_AUDIT` ([`AuditRecord::write_json`]) — and parsed
//! back by `rankguard report` ([`AuditRecord::parse`]). docs/design.md, "The record".
//!
//! Rendering allocates nothing: it writes into a caller-provided buffer ([`FixedWriter`]),
//! so the guard can render where fork or signals could find the allocator's lock held.
//! Every text field is capped ([`caps`]); a value cut to its cap ends with [`CUT_MARK`],
//! inside its JSON string, so the record stays one valid JSON line. Stacks are cut whole
//! frames at a time (`py_stack_cut`, `native_stack_cut`) so the record fits [`RECORD_MAX`];
//! a record that would still not fit is written without its stacks, never torn.

use std::borrow::Cow;
use std::fmt::{self, Write};

use crate::config::Mode;
use crate::json::{parse_json, Json};
use crate::policy::{Detail, Rule};
use crate::strtab::StrTable;

/// A text field: borrowed when the guard builds a record, owned when the report parses one.
pub type Text<'a> = Cow<'a, str>;

/// Longest record, in bytes (newline included): the guard writes each with one `write(2)`
/// on an `O_APPEND` descriptor, so records of many processes never interleave.
/// `rankguard report` skips lines over 64 KiB.
pub const RECORD_MAX: usize = 48 * 1024;

/// Room that always holds a record without its stacks, whatever its fields hold (every
/// field at its cap, every byte a control character escaped to six): a caller whose buffer
/// is at least this large never loses a record (`rendered_whole_in_fixed_max` checks it).
pub const FIXED_MAX: usize = 16 * 1024;

/// The audit record's format name and version, the first two members of every record
/// (docs/schema/audit-record.v1.json). Records written before they existed carry neither
/// and still parse: every member but `call`, `rule` and `verdict` is optional.
pub const FORMAT: &str = "rankguard-audit";
pub const VERSION: u32 = 1;

/// Ends a text value that was cut to its cap.
pub const CUT_MARK: &str = "...[cut]";

/// Caps, in bytes of source text, of each text field (the marker comes on top).
pub mod caps {
    pub const CALL: usize = 64;
    pub const HOST: usize = 64;
    pub const JOB: usize = 128;
    pub const CVD: usize = 256;
    pub const GPU: usize = 64;
    pub const RANK_GPU: usize = 128;
    pub const ARGS: usize = 400;
    pub const DETAIL: usize = 250;
    pub const SITE: usize = 240;
    pub const FRAME: usize = 300;
    pub const HANDLE: usize = 16;
    pub const KEY: usize = 40;
    pub const DECISION: usize = 80;
    pub const LOCATION: usize = 24;
}

/// What the guard did with the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Recorded and let through (warn mode).
    Warn,
    /// Denied (enforce), or the process was stopped (abort; R1 in enforce).
    Deny,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Warn => "warn",
            Action::Deny => "deny",
        }
    }
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "warn" => Some(Action::Warn),
            "deny" => Some(Action::Deny),
            _ => None,
        }
    }
}

/// A rule as a record names it: one this build knows, or the id a newer guard wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleId<'a> {
    Known(Rule),
    Other(Text<'a>),
}

impl RuleId<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            RuleId::Known(r) => r.as_str(),
            RuleId::Other(s) => s,
        }
    }
}

/// A rank root as a record names it (`src/guard/5_process/root_walk.rs`, crate::rank_root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootRef<'a> {
    pub pid: u32,
    pub start: u64,
    pub host: Option<Text<'a>>,
}

/// The exporter of an imported IPC/VMM handle, from the provenance registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exporter<'a> {
    pub pid: u32,
    pub rank: Option<u32>,
    pub job: Option<Text<'a>>,
    pub gpu: Option<Text<'a>>,
    pub location: Text<'a>,
    pub rank_root: Option<RootRef<'a>>,
}

/// The fields only some rules' records carry.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RuleFields<'a> {
    #[default]
    None,
    /// R1 at `cuInit`: what the process saw.
    Init {
        devices: i32,
        entries: u32,
        /// The UUID of the one device the process sees, when it could be read.
        sees: Option<Text<'a>>,
    },
    /// R3 at an import: the handle and what the registry knew of its exporter.
    Import {
        handle: Option<Text<'a>>,
        key: Option<Text<'a>>,
        decision: Text<'a>,
        /// None: no trusted provenance record.
        exporter: Option<Exporter<'a>>,
    },
    /// R3 after an import: the driver mapped the memory on another device.
    Mapping { device: i32 },
}

/// A summary record (`"summary":true`): `count` occurrences after the site's full records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub count: u64,
    /// When the counted occurrences began (µs since the epoch); None when unknown.
    pub since_us: Option<u64>,
}

/// One audit record. The guard fills it from its state and the decision; the report parses
/// it back (fields absent in records of older guards are None or empty).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AuditRecord<'a> {
    /// When (µs since the epoch).
    pub ts_us: Option<u64>,
    pub summary: Option<Summary>,
    pub call: Text<'a>,
    pub abi: Option<Text<'a>>,
    pub action: Option<Action>,
    pub rule: Option<RuleId<'a>>,
    pub mode: Option<Mode>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub host: Option<Text<'a>>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub job: Option<Text<'a>>,
    /// The rank root, when no rank variables name the rank.
    pub rank_root: Option<RootRef<'a>>,
    /// The device ordinal the call named, for ordinal rules.
    pub ordinal: Option<i32>,
    /// `CUDA_VISIBLE_DEVICES` at the call (bytes that are not UTF-8 escaped as `\xNN`).
    pub cvd: Option<Text<'a>>,
    /// The GPU this process sees (its UUID).
    pub gpu: Option<Text<'a>>,
    /// The rank's GPU as the launcher named it (`RANKGUARD_RANK_GPU`, else the rank root's).
    pub rank_gpu: Option<Text<'a>>,
    /// That GPU's full UUID, when the launcher resolved it (`RANKGUARD_RANK_GPU_UUID`).
    pub rank_gpu_uuid: Option<Text<'a>>,
    pub args: Option<Text<'a>>,
    pub detail: Option<Text<'a>>,
    pub rule_fields: RuleFields<'a>,
    /// Where the call came from (`guard/6_audit/site.rs`).
    pub site: Option<Text<'a>>,
    /// Python frames, outermost first.
    pub py_stack: Cow<'a, [String]>,
    pub py_stack_cut: bool,
    /// Native frames, innermost first.
    pub native_stack: Cow<'a, [String]>,
    pub native_stack_cut: bool,
}

// ---------------------------------------------------------------------------------------
// Rendering

/// A `fmt::Write` into a caller-provided byte buffer: never allocates, never writes past
/// the buffer. Text that does not fit is dropped and remembered ([`FixedWriter::overflowed`]),
/// so a caller can tell a complete rendering from a cut one.
pub struct FixedWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    overflow: bool,
}

impl<'b> FixedWriter<'b> {
    pub fn new(buf: &'b mut [u8]) -> Self {
        FixedWriter {
            buf,
            len: 0,
            overflow: false,
        }
    }
    // `get`, not indexing, here and in `push_bytes` (`len` never passes the buffer's end):
    // an index keeps a panic location, a relocation the guard's copy of this code pays at
    // every process start (docs/benchmarks.md, "What the loader's added instructions are
    // made of").
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn overflowed(&self) -> bool {
        self.overflow
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.len
    }
    /// Forget everything written after `len` (a mark taken with [`FixedWriter::len`]).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.overflow = false;
    }
    /// Append as much of `bytes` as fits.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.remaining());
        if let (Some(to), Some(from)) = (self.buf.get_mut(self.len..self.len + n), bytes.get(..n)) {
            to.copy_from_slice(from);
        }
        self.len += n;
        if n < bytes.len() {
            self.overflow = true;
        }
    }
}

impl Write for FixedWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Whole strings only: a piece that does not fit is dropped, never half-written
        // (a JSON escape or UTF-8 sequence is never split).
        if s.len() > self.remaining() {
            self.overflow = true;
            return Err(fmt::Error);
        }
        self.push_bytes(s.as_bytes());
        Ok(())
    }
}

/// Counts what would be written (sizes a frame before it is written).
struct Counter(usize);

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// A JSON string literal of at most `cap` source bytes, cut on a character boundary and
/// then marked with [`CUT_MARK`].
pub fn json_str<W: Write>(w: &mut W, s: &str, cap: usize) -> fmt::Result {
    w.write_char('"')?;
    let (text, cut) = cut_at(s, cap);
    for c in text.chars() {
        match c {
            '"' => w.write_str("\\\"")?,
            '\\' => w.write_str("\\\\")?,
            '\n' => w.write_str("\\n")?,
            '\r' => w.write_str("\\r")?,
            '\t' => w.write_str("\\t")?,
            c if (c as u32) < 0x20 => write!(w, "\\u{:04x}", c as u32)?,
            c => w.write_char(c)?,
        }
    }
    if cut {
        w.write_str(CUT_MARK)?;
    }
    w.write_char('"')
}

/// `Some(s)` as a JSON string, `None` as null.
pub fn json_opt_str<W: Write>(w: &mut W, s: Option<&str>, cap: usize) -> fmt::Result {
    match s {
        Some(s) => json_str(w, s, cap),
        None => w.write_str("null"),
    }
}

/// `s` cut to at most `cap` bytes on a character boundary; true when cut.
pub fn cut_at(s: &str, cap: usize) -> (&str, bool) {
    if s.len() <= cap {
        return (s, false);
    }
    let mut end = cap;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

/// Text cut to its cap, with the marker when cut (the stderr line's form of a field).
struct Capped<'s>(&'s str, usize);

impl fmt::Display for Capped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (t, cut) = cut_at(self.0, self.1);
        f.write_str(t)?;
        if cut {
            f.write_str(CUT_MARK)?;
        }
        Ok(())
    }
}

fn opt_u32<W: Write>(w: &mut W, name: &str, v: Option<u32>) -> fmt::Result {
    match v {
        Some(x) => write!(w, ",\"{name}\":{x}"),
        None => write!(w, ",\"{name}\":null"),
    }
}

fn write_ts<W: Write>(w: &mut W, us: u64) -> fmt::Result {
    write!(w, "{}.{:06}", us / 1_000_000, us % 1_000_000)
}

fn write_root<W: Write>(w: &mut W, name: &str, root: Option<&RootRef<'_>>) -> fmt::Result {
    let Some(r) = root else {
        return write!(w, ",\"{name}\":null");
    };
    write!(
        w,
        ",\"{name}\":{{\"pid\":{},\"start\":{},\"host\":",
        r.pid, r.start
    )?;
    json_opt_str(w, r.host.as_deref(), caps::HOST)?;
    w.write_char('}')
}

/// Room kept for the closing members and `}\n` after the stacks.
const TAIL_ROOM: usize = 96;

impl AuditRecord<'_> {
    /// The rule's id, `?` when unknown.
    pub fn rule_str(&self) -> &str {
        self.rule.as_ref().map_or("?", RuleId::as_str)
    }

    /// The JSON line (one object and a newline) into `w`, within [`RECORD_MAX`] bytes and
    /// `w`'s room: stacks are cut whole frames first; if even that does not fit, the
    /// record is written without stacks. Err only when not even that fits (then `w` holds
    /// nothing of it).
    pub fn write_json(&self, w: &mut FixedWriter<'_>) -> fmt::Result {
        let start = w.len();
        let room = w.remaining().min(RECORD_MAX);
        if self.json_within(w, room, true).is_ok() && !w.overflowed() {
            return Ok(());
        }
        w.truncate(start);
        if self.json_within(w, room, false).is_ok() && !w.overflowed() {
            return Ok(());
        }
        w.truncate(start);
        Err(fmt::Error)
    }

    fn json_within(&self, w: &mut FixedWriter<'_>, room: usize, stacks: bool) -> fmt::Result {
        let start = w.len();
        let format = FORMAT; // a local: `{FORMAT}` would be a relocated constant (narrow.rs)
        write!(w, "{{\"format\":\"{format}\",\"version\":{VERSION},\"ts\":")?;
        match self.ts_us {
            Some(us) => write_ts(w, us)?,
            None => w.write_str("null")?,
        }
        if let Some(s) = self.summary {
            write!(w, ",\"summary\":true,\"count\":{},\"since\":", s.count)?;
            match s.since_us {
                Some(us) => write_ts(w, us)?,
                None => w.write_str("null")?,
            }
        }
        w.write_str(",\"call\":")?;
        json_str(w, &self.call, caps::CALL)?;
        w.write_str(",\"abi\":")?;
        json_opt_str(w, self.abi.as_deref(), caps::CALL)?;
        w.write_str(",\"verdict\":")?;
        json_opt_str(w, self.action.map(Action::as_str), caps::CALL)?;
        w.write_str(",\"rule\":")?;
        json_opt_str(w, self.rule.as_ref().map(RuleId::as_str), caps::CALL)?;
        w.write_str(",\"mode\":")?;
        json_opt_str(w, self.mode.map(Mode::as_str), caps::CALL)?;
        opt_u32(w, "pid", self.pid)?;
        if let Some(t) = self.tid {
            write!(w, ",\"tid\":{t}")?;
        }
        w.write_str(",\"host\":")?;
        json_opt_str(w, self.host.as_deref(), caps::HOST)?;
        opt_u32(w, "rank", self.rank)?;
        opt_u32(w, "local_rank", self.local_rank)?;
        w.write_str(",\"job\":")?;
        json_opt_str(w, self.job.as_deref(), caps::JOB)?;
        write_root(w, "rank_root", self.rank_root.as_ref())?;
        if self.summary.is_none() {
            if let Some(o) = self.ordinal {
                write!(w, ",\"ordinal\":{o}")?;
            }
            for (name, v, cap) in [
                ("cvd", &self.cvd, caps::CVD),
                ("gpu", &self.gpu, caps::GPU),
                ("rank_gpu", &self.rank_gpu, caps::RANK_GPU),
                ("rank_gpu_uuid", &self.rank_gpu_uuid, caps::RANK_GPU),
                ("args", &self.args, caps::ARGS),
                ("detail", &self.detail, caps::DETAIL),
            ] {
                write!(w, ",\"{name}\":")?;
                json_opt_str(w, v.as_deref(), cap)?;
            }
            self.rule_fields_json(w)?;
        }
        w.write_str(",\"site\":")?;
        json_opt_str(w, self.site.as_deref(), caps::SITE)?;
        if self.summary.is_none() {
            let used = w.len() - start;
            let mut left = room.saturating_sub(used + TAIL_ROOM);
            let (py_keep, py_cut) = if stacks {
                fit_frames(self.py_stack.iter().rev(), &mut left)
            } else {
                (0, !self.py_stack.is_empty())
            };
            let (native_keep, native_cut) = if stacks {
                fit_frames(self.native_stack.iter(), &mut left)
            } else {
                (0, !self.native_stack.is_empty())
            };
            if !self.py_stack.is_empty() || self.py_stack_cut {
                w.write_str(",\"py_stack\":[")?;
                let from = self.py_stack.len() - py_keep;
                for (i, f) in self.py_stack.iter().skip(from).enumerate() {
                    if i > 0 {
                        w.write_char(',')?;
                    }
                    json_str(w, f, caps::FRAME)?;
                }
                w.write_char(']')?;
                if py_cut || self.py_stack_cut {
                    w.write_str(",\"py_stack_cut\":true")?;
                }
            }
            w.write_str(",\"native_stack\":[")?;
            for (i, f) in self.native_stack.iter().take(native_keep).enumerate() {
                if i > 0 {
                    w.write_char(',')?;
                }
                json_str(w, f, caps::FRAME)?;
            }
            w.write_char(']')?;
            if native_cut || self.native_stack_cut {
                w.write_str(",\"native_stack_cut\":true")?;
            }
        }
        w.write_str("}\n")?;
        if w.len() - start > room {
            return Err(fmt::Error);
        }
        Ok(())
    }

    fn rule_fields_json<W: Write>(&self, w: &mut W) -> fmt::Result {
        match &self.rule_fields {
            RuleFields::None => Ok(()),
            RuleFields::Init {
                devices,
                entries,
                sees,
            } => {
                write!(w, ",\"devices\":{devices},\"entries\":{entries},\"sees\":")?;
                json_opt_str(w, sees.as_deref(), caps::GPU)
            }
            RuleFields::Import {
                handle,
                key,
                decision,
                exporter,
            } => {
                w.write_str(",\"handle\":")?;
                json_opt_str(w, handle.as_deref(), caps::HANDLE)?;
                w.write_str(",\"key\":")?;
                json_opt_str(w, key.as_deref(), caps::KEY)?;
                w.write_str(",\"decision\":")?;
                json_str(w, decision, caps::DECISION)?;
                let Some(x) = exporter else {
                    return w.write_str(",\"exporter_pid\":null,\"exporter_gpu\":null");
                };
                write!(w, ",\"exporter_pid\":{}", x.pid)?;
                opt_u32(w, "exporter_rank", x.rank)?;
                w.write_str(",\"exporter_job\":")?;
                json_opt_str(w, x.job.as_deref(), caps::JOB)?;
                w.write_str(",\"exporter_gpu\":")?;
                json_opt_str(w, x.gpu.as_deref(), caps::GPU)?;
                w.write_str(",\"exporter_location\":")?;
                json_str(w, &x.location, caps::LOCATION)?;
                write_root(w, "exporter_rank_root", x.rank_root.as_ref())
            }
            RuleFields::Mapping { device } => write!(
                w,
                ",\"decision\":\"mapping on device {device}\",\"device\":{device}"
            ),
        }
    }

    /// The stderr line after its prefix (`host:pid:tid [rank N] RANKGUARD DENY ` or `WARN `,
    /// which the guard writes): `call(args) denied [R2 cuda:0 only]: detail;
    /// CUDA_VISIBLE_DEVICES=.., rank GPU ..; at SITE; fix: ..` and a newline. Fields are
    /// capped as in the JSON; an unset CVD is said `<unset>`.
    pub fn write_line<W: Write>(&self, w: &mut W) -> fmt::Result {
        let verdict = match (self.action, self.mode) {
            (Some(Action::Deny), Some(Mode::Abort)) => "aborting",
            (Some(Action::Deny), _) => "denied",
            _ => "allowed (warn mode)",
        };
        let rule = match &self.rule {
            Some(RuleId::Known(r)) => Some(*r),
            _ => None,
        };
        let cvd = match self.cvd.as_deref() {
            None => "<unset>",
            Some("") => "<empty>",
            Some(s) => s,
        };
        let rank_gpu = self
            .rank_gpu_uuid
            .as_deref()
            .or(self.rank_gpu.as_deref())
            .or(self.gpu.as_deref())
            .unwrap_or("unknown");
        write!(
            w,
            "{}({}) {verdict} [{} {}]: {}; CUDA_VISIBLE_DEVICES={}, rank GPU {}",
            Capped(&self.call, caps::CALL),
            Capped(self.args.as_deref().unwrap_or(""), caps::ARGS),
            self.rule_str(),
            rule.map_or("?", Rule::name),
            Capped(self.detail.as_deref().unwrap_or(""), caps::DETAIL),
            Capped(cvd, caps::CVD),
            Capped(rank_gpu, caps::RANK_GPU),
        )?;
        self.rule_fields_line(w)?;
        // The site, then the fix: the fix never reads as if the site had done it.
        writeln!(
            w,
            "; at {}; fix: {}",
            Capped(self.site.as_deref().unwrap_or("<unknown site>"), caps::SITE),
            rule.map_or("?", Rule::fix),
        )
    }

    fn rule_fields_line<W: Write>(&self, w: &mut W) -> fmt::Result {
        match &self.rule_fields {
            RuleFields::None => Ok(()),
            RuleFields::Init { sees, .. } => {
                if [Detail::NOT_RANK_GPU, Detail::REPOINTED_ITSELF]
                    .iter()
                    .any(|d| self.detail.as_deref() == Some(d))
                {
                    write!(
                        w,
                        "; this process sees {}",
                        Capped(sees.as_deref().unwrap_or("no identifiable GPU"), caps::GPU)
                    )?;
                }
                Ok(())
            }
            RuleFields::Import { key, exporter, .. } => match exporter {
                Some(x) => {
                    write!(
                        w,
                        "; the {} handle was exported by pid {} (rank ",
                        match &self.rule_fields {
                            RuleFields::Import {
                                handle: Some(h), ..
                            } => Capped(h, caps::HANDLE),
                            _ => Capped("?", caps::HANDLE),
                        },
                        x.pid
                    )?;
                    match (x.rank, &x.rank_root) {
                        (Some(r), _) => write!(w, "{r}")?,
                        (None, Some(root)) => write!(w, "root {}", root.pid)?,
                        (None, None) => w.write_char('-')?,
                    }
                    write!(
                        w,
                        ") on {}, imported here on {}",
                        Capped(x.gpu.as_deref().unwrap_or("an unknown GPU"), caps::GPU),
                        Capped(self.gpu.as_deref().unwrap_or("an unknown GPU"), caps::GPU)
                    )
                }
                None => write!(
                    w,
                    "; no trusted provenance record for handle {}",
                    Capped(key.as_deref().unwrap_or("(no unique identity)"), caps::KEY)
                ),
            },
            RuleFields::Mapping { device } => write!(
                w,
                "; the driver reports the imported memory on device {device}"
            ),
        }
    }
}

/// How many frames (from the iterator's start) fit in `left` bytes; true when some did
/// not. `left` is reduced by what they take.
fn fit_frames<'s>(frames: impl Iterator<Item = &'s String>, left: &mut usize) -> (usize, bool) {
    let mut n = 0;
    for f in frames {
        let mut c = Counter(0);
        let _ = json_str(&mut c, f, caps::FRAME);
        if c.0 + 1 > *left {
            return (n, true);
        }
        *left -= c.0 + 1;
        n += 1;
    }
    (n, false)
}

// ---------------------------------------------------------------------------------------
// The map record

/// R1's outcome at a process's first `cuInit`, as the map record names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapR1 {
    /// Kept.
    Ok,
    /// Broken; the process was stopped (enforce, abort).
    Deny,
    /// Broken; the process was let run (warn).
    Warn,
}

impl MapR1 {
    pub fn as_str(self) -> &'static str {
        // As `Mode::as_str`: no table of string pointers.
        const NAMES: StrTable<3> = crate::str_table!("ok", "deny", "warn");
        NAMES.get(self as usize)
    }
    pub fn parse(s: &str) -> Option<MapR1> {
        match s {
            "ok" => Some(MapR1::Ok),
            "deny" => Some(MapR1::Deny),
            "warn" => Some(MapR1::Warn),
            _ => None,
        }
    }
}

/// The `kind` member of a map record (decision records carry none).
pub const MAP_KIND: &str = "map";

/// Longest map record: every field at its cap, escaped (`map_record_fits` checks it).
pub const MAP_MAX: usize = 8 * 1024;

/// One map record (`"kind":"map"`, docs/report.md "The map record"): which GPU one guarded
/// process saw at its first `cuInit`, written once per process so that a clean job still
/// shows rank -> processes -> GPU (`rankguard report --map`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MapRecord<'a> {
    pub ts_us: Option<u64>,
    pub host: Option<Text<'a>>,
    pub pid: u32,
    /// Start time, clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start: Option<u64>,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub job: Option<Text<'a>>,
    pub rank_root: Option<RootRef<'a>>,
    pub mode: Option<Mode>,
    /// `CUDA_VISIBLE_DEVICES` at the first `cuInit` (None: unset).
    pub cvd: Option<Text<'a>>,
    /// `CUDA_VISIBLE_DEVICES` the process was started with (None: unset).
    pub cvd_start: Option<Text<'a>>,
    pub devices: i32,
    /// The UUID of the one device it sees.
    pub gpu: Option<Text<'a>>,
    pub rank_gpu: Option<Text<'a>>,
    pub rank_gpu_uuid: Option<Text<'a>>,
    pub r1: Option<MapR1>,
}

impl MapRecord<'_> {
    /// The JSON line (one object and a newline). Err only when `w` has no room for it.
    pub fn write_json(&self, w: &mut FixedWriter<'_>) -> fmt::Result {
        let start = w.len();
        let r = self.json(w);
        if r.is_err() || w.overflowed() {
            w.truncate(start);
            return Err(fmt::Error);
        }
        Ok(())
    }

    fn json<W: Write>(&self, w: &mut W) -> fmt::Result {
        // Locals: `{FORMAT}` would be a relocated constant (narrow.rs).
        let (format, kind) = (FORMAT, MAP_KIND);
        write!(
            w,
            "{{\"format\":\"{format}\",\"version\":{VERSION},\"kind\":\"{kind}\",\"ts\":"
        )?;
        match self.ts_us {
            Some(us) => write_ts(w, us)?,
            None => w.write_str("null")?,
        }
        w.write_str(",\"host\":")?;
        json_opt_str(w, self.host.as_deref(), caps::HOST)?;
        write!(w, ",\"pid\":{}", self.pid)?;
        match self.start {
            Some(t) => write!(w, ",\"start\":{t}")?,
            None => w.write_str(",\"start\":null")?,
        }
        opt_u32(w, "rank", self.rank)?;
        opt_u32(w, "local_rank", self.local_rank)?;
        w.write_str(",\"job\":")?;
        json_opt_str(w, self.job.as_deref(), caps::JOB)?;
        write_root(w, "rank_root", self.rank_root.as_ref())?;
        w.write_str(",\"mode\":")?;
        json_opt_str(w, self.mode.map(Mode::as_str), caps::CALL)?;
        for (name, v, cap) in [
            ("cvd", &self.cvd, caps::CVD),
            ("cvd_start", &self.cvd_start, caps::CVD),
        ] {
            write!(w, ",\"{name}\":")?;
            json_opt_str(w, v.as_deref(), cap)?;
        }
        write!(w, ",\"devices\":{}", self.devices)?;
        for (name, v, cap) in [
            ("gpu", &self.gpu, caps::GPU),
            ("rank_gpu", &self.rank_gpu, caps::RANK_GPU),
            ("rank_gpu_uuid", &self.rank_gpu_uuid, caps::RANK_GPU),
        ] {
            write!(w, ",\"{name}\":")?;
            json_opt_str(w, v.as_deref(), cap)?;
        }
        w.write_str(",\"r1\":")?;
        json_opt_str(w, self.r1.map(MapR1::as_str), caps::CALL)?;
        w.write_str("}\n")
    }

    /// The debug log's sentence (`RANKGUARD_DEBUG=INFO`): `pid P (rank R) sees GPU-.. (1
    /// device; CUDA_VISIBLE_DEVICES=3, started with 3); rank GPU 3; R1 kept`.
    pub fn write_line<W: Write>(&self, w: &mut W) -> fmt::Result {
        fn cvd(v: Option<&str>) -> Capped<'_> {
            match v {
                None => Capped("<unset>", caps::CVD),
                Some("") => Capped("<empty>", caps::CVD),
                Some(s) => Capped(s, caps::CVD),
            }
        }
        write!(w, "GPU map: pid {} ", self.pid)?;
        match (self.rank, &self.rank_root) {
            (Some(r), _) => write!(w, "(rank {r})")?,
            (None, Some(root)) if root.pid == self.pid => w.write_str("(its own rank root)")?,
            (None, Some(root)) => write!(w, "(rank root {})", root.pid)?,
            (None, None) => w.write_str("(rank -)")?,
        }
        match self.gpu.as_deref() {
            Some(g) => write!(w, " sees {}", Capped(g, caps::GPU))?,
            None => write!(w, " sees no single identifiable GPU")?,
        }
        write!(
            w,
            " ({} device{}; CUDA_VISIBLE_DEVICES={}, started with {})",
            self.devices,
            if self.devices == 1 { "" } else { "s" },
            cvd(self.cvd.as_deref()),
            cvd(self.cvd_start.as_deref()),
        )?;
        if let Some(g) = self.rank_gpu_uuid.as_deref().or(self.rank_gpu.as_deref()) {
            write!(w, "; rank GPU {}", Capped(g, caps::RANK_GPU))?;
        }
        let r1 = match self.r1 {
            Some(MapR1::Ok) => "R1 kept",
            Some(MapR1::Deny) => "R1 broken: stopped",
            Some(MapR1::Warn) => "R1 broken: let run (warn mode)",
            None => "R1 not recorded",
        };
        writeln!(w, "; {r1}")
    }
}

impl MapRecord<'static> {
    /// A map record from its JSON line. `pid`, `devices` and `r1` are required; the other
    /// members are optional (null or absent), so a newer guard's extra members are ignored.
    pub fn parse(line: &str) -> Result<MapRecord<'static>, String> {
        Self::from_json(&json_line(line)?)
    }

    fn from_json(v: &Json) -> Result<MapRecord<'static>, String> {
        if !is_map(v) {
            return Err("not a map record: 'kind' is not \"map\"".into());
        }
        let need = |k: &str| format!("not a map record: field '{k}' is missing");
        let r1 = opt_str(v, "r1")?.ok_or_else(|| need("r1"))?;
        Ok(MapRecord {
            ts_us: opt_time(v, "ts")?,
            host: opt_str(v, "host")?,
            pid: opt_u32_field(v, "pid")?.ok_or_else(|| need("pid"))?,
            start: opt_int(v, "start", 0, i64::MAX)?.map(|n| n as u64),
            rank: opt_u32_field(v, "rank")?,
            local_rank: opt_u32_field(v, "local_rank")?,
            job: opt_str(v, "job")?,
            rank_root: opt_root(v, "rank_root")?,
            mode: opt_str(v, "mode")?.and_then(|m| Mode::parse(&m)),
            cvd: opt_str(v, "cvd")?,
            cvd_start: opt_str(v, "cvd_start")?,
            devices: opt_i32_field(v, "devices")?.ok_or_else(|| need("devices"))?,
            gpu: opt_str(v, "gpu")?,
            rank_gpu: opt_str(v, "rank_gpu")?,
            rank_gpu_uuid: opt_str(v, "rank_gpu_uuid")?,
            r1: Some(MapR1::parse(&r1).ok_or_else(|| bad("r1", "\"ok\", \"deny\" or \"warn\""))?),
        })
    }
}

/// One line of an audit file: a decision record or a map record.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    Decision(Box<AuditRecord<'static>>),
    Map(Box<MapRecord<'static>>),
}

/// One audit line, parsed once and read as the record kind its `kind` names.
pub fn parse_line(line: &str) -> Result<Line, String> {
    let v = json_line(line)?;
    if is_map(&v) {
        MapRecord::from_json(&v).map(|m| Line::Map(Box::new(m)))
    } else {
        AuditRecord::from_json(&v).map(|r| Line::Decision(Box::new(r)))
    }
}

/// One audit line as JSON: the reasons a line is not JSON are worded for a person reading
/// a report (a cut write is "partial").
pub fn json_line(line: &str) -> Result<Json, String> {
    parse_json(line).map_err(|e| {
        if e.starts_with("the line ends") {
            format!("partial record: {e} (a cut or interleaved write?)")
        } else {
            format!("not JSON: {e}")
        }
    })
}

/// Whether a parsed audit line is a map record (`"kind":"map"`).
pub fn is_map(v: &Json) -> bool {
    matches!(v.get("kind"), Some(Json::Str(k)) if k == MAP_KIND)
}

// ---------------------------------------------------------------------------------------
// Parsing (what `rankguard report` reads back)

fn bad(key: &str, what: &str) -> String {
    format!("not an audit record: field '{key}' is not {what}")
}

fn opt_str(v: &Json, key: &str) -> Result<Option<Text<'static>>, String> {
    match v.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Str(s)) => Ok(Some(Cow::Owned(s.clone()))),
        Some(_) => Err(bad(key, "a string")),
    }
}

fn opt_int(v: &Json, key: &str, min: i64, max: i64) -> Result<Option<i64>, String> {
    match v.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Num(n))
            if n.fract() == 0.0 && n.abs() < 9.0e15 && (min..=max).contains(&(*n as i64)) =>
        {
            Ok(Some(*n as i64))
        }
        Some(_) => Err(bad(key, "an integer")),
    }
}

fn opt_u32_field(v: &Json, key: &str) -> Result<Option<u32>, String> {
    Ok(opt_int(v, key, 0, u32::MAX.into())?.map(|n| n as u32))
}

fn opt_i32_field(v: &Json, key: &str) -> Result<Option<i32>, String> {
    Ok(opt_int(v, key, i32::MIN.into(), i32::MAX.into())?.map(|n| n as i32))
}

fn opt_time(v: &Json, key: &str) -> Result<Option<u64>, String> {
    match v.get(key) {
        None | Some(Json::Null) => Ok(None),
        // Rendered with 6 decimals: the nearest microsecond is the one written.
        Some(Json::Num(n)) if n.is_finite() && *n >= 0.0 => Ok(Some((n * 1e6).round() as u64)),
        Some(_) => Err(bad(key, "a time in seconds")),
    }
}

fn str_list(v: &Json, key: &str) -> Result<Vec<String>, String> {
    match v.get(key) {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Arr(items)) => items
            .iter()
            .map(|i| match i {
                Json::Str(s) => Ok(s.clone()),
                _ => Err(bad(key, "a list of strings")),
            })
            .collect(),
        Some(_) => Err(bad(key, "a list of strings")),
    }
}

fn flag(v: &Json, key: &str) -> Result<bool, String> {
    match v.get(key) {
        None | Some(Json::Null) | Some(Json::Bool(false)) => Ok(false),
        Some(Json::Bool(true)) => Ok(true),
        Some(_) => Err(bad(key, "true or false")),
    }
}

fn req_str(v: &Json, key: &str) -> Result<Text<'static>, String> {
    match opt_str(v, key)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(format!("not an audit record: field '{key}' is missing")),
    }
}

fn opt_root(v: &Json, key: &str) -> Result<Option<RootRef<'static>>, String> {
    let bad = || bad(key, "a rank root {pid, start, host}");
    match v.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(o @ Json::Obj(_)) => Ok(Some(RootRef {
            pid: opt_u32_field(o, "pid")
                .map_err(|_| bad())?
                .ok_or_else(bad)?,
            start: opt_int(o, "start", 0, i64::MAX)
                .map_err(|_| bad())?
                .ok_or_else(bad)? as u64,
            host: opt_str(o, "host").map_err(|_| bad())?,
        })),
        Some(_) => Err(bad()),
    }
}

impl AuditRecord<'static> {
    /// The record in one audit line. `call`, `rule` and `verdict` are required; every
    /// other field is optional, so records of older or newer guards still parse (unknown
    /// fields are ignored, an unknown rule is kept under its own id).
    pub fn parse(line: &str) -> Result<AuditRecord<'static>, String> {
        Self::from_json(&json_line(line)?)
    }

    /// The record in a line already parsed as a JSON object.
    pub fn from_json(v: &Json) -> Result<AuditRecord<'static>, String> {
        if !matches!(v, Json::Obj(_)) {
            return Err("not an audit record: a JSON value that is not an object".into());
        }
        let summary = if flag(v, "summary")? {
            match opt_int(v, "count", 1, i64::MAX) {
                Ok(Some(n)) => Some(Summary {
                    count: n as u64,
                    since_us: opt_time(v, "since")?,
                }),
                _ => return Err("not an audit record: a summary without a positive 'count'".into()),
            }
        } else {
            None
        };
        let call = req_str(v, "call")?;
        let verdict = req_str(v, "verdict")?;
        let action =
            Action::parse(&verdict).ok_or_else(|| bad("verdict", "\"warn\" or \"deny\""))?;
        let rule = req_str(v, "rule")?;
        let rule = match Rule::parse(&rule) {
            Some(r) => RuleId::Known(r),
            None => RuleId::Other(rule),
        };
        // A mode this build does not know (a newer guard's) is left out, not refused.
        let mode = opt_str(v, "mode")?.and_then(|m| Mode::parse(&m));
        let rule_fields = if v.get("devices").is_some() || v.get("sees").is_some() {
            RuleFields::Init {
                devices: opt_i32_field(v, "devices")?.unwrap_or(0),
                entries: opt_u32_field(v, "entries")?.unwrap_or(0),
                sees: opt_str(v, "sees")?,
            }
        } else if let (Some(device), Some(_)) = (opt_i32_field(v, "device")?, v.get("decision")) {
            RuleFields::Mapping { device }
        } else if v.get("decision").is_some() || v.get("exporter_pid").is_some() {
            RuleFields::Import {
                handle: opt_str(v, "handle")?,
                key: opt_str(v, "key")?,
                decision: opt_str(v, "decision")?.unwrap_or_default(),
                exporter: match opt_u32_field(v, "exporter_pid")? {
                    None => None,
                    Some(pid) => Some(Exporter {
                        pid,
                        rank: opt_u32_field(v, "exporter_rank")?,
                        job: opt_str(v, "exporter_job")?,
                        gpu: opt_str(v, "exporter_gpu")?,
                        location: opt_str(v, "exporter_location")?.unwrap_or_default(),
                        rank_root: opt_root(v, "exporter_rank_root")?,
                    }),
                },
            }
        } else {
            RuleFields::None
        };
        Ok(AuditRecord {
            ts_us: opt_time(v, "ts")?,
            summary,
            call,
            abi: opt_str(v, "abi")?,
            action: Some(action),
            rule: Some(rule),
            mode,
            pid: opt_u32_field(v, "pid")?,
            tid: opt_u32_field(v, "tid")?,
            host: opt_str(v, "host")?,
            rank: opt_u32_field(v, "rank")?,
            local_rank: opt_u32_field(v, "local_rank")?,
            job: opt_str(v, "job")?,
            rank_root: opt_root(v, "rank_root")?,
            ordinal: opt_i32_field(v, "ordinal")?,
            cvd: opt_str(v, "cvd")?,
            gpu: opt_str(v, "gpu")?,
            rank_gpu: opt_str(v, "rank_gpu")?,
            rank_gpu_uuid: opt_str(v, "rank_gpu_uuid")?,
            args: opt_str(v, "args")?,
            detail: opt_str(v, "detail")?,
            rule_fields,
            site: opt_str(v, "site")?,
            py_stack: Cow::Owned(str_list(v, "py_stack")?),
            py_stack_cut: flag(v, "py_stack_cut")?,
            native_stack: Cow::Owned(str_list(v, "native_stack")?),
            native_stack_cut: flag(v, "native_stack_cut")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse_json;

    fn t(s: &str) -> Text<'_> {
        Cow::Borrowed(s)
    }

    fn render(r: &AuditRecord<'_>) -> String {
        let mut buf = vec![0u8; RECORD_MAX];
        let mut w = FixedWriter::new(&mut buf);
        r.write_json(&mut w).unwrap();
        String::from_utf8(w.as_bytes().to_vec()).unwrap()
    }

    fn full() -> AuditRecord<'static> {
        AuditRecord {
            ts_us: Some(1_764_527_000_123_456),
            call: t("cuDeviceGet"),
            abi: Some(t("cuDeviceGet")),
            action: Some(Action::Deny),
            rule: Some(RuleId::Known(Rule::R2)),
            mode: Some(Mode::Enforce),
            pid: Some(4242),
            tid: Some(4243),
            host: Some(t("node-\"1\"")),
            rank: Some(3),
            local_rank: Some(1),
            job: Some(t("slurm:99.1")),
            rank_root: Some(RootRef {
                pid: 17,
                start: 123_456,
                host: Some(t("node-1")),
            }),
            ordinal: Some(1),
            cvd: Some(t("GPU-\\xff,1")),
            gpu: Some(t("GPU-12c0ffee-0000-4000-8000-000000000002")),
            rank_gpu: Some(t("2")),
            rank_gpu_uuid: Some(t("GPU-12c0ffee-0000-4000-8000-000000000002")),
            args: Some(t("device=0x7ffd, ordinal=1")),
            detail: Some(t("device ordinal 1 is not 0")),
            rule_fields: RuleFields::Import {
                handle: Some(t("mem")),
                key: Some(t("ab12")),
                decision: t("cross-device"),
                exporter: Some(Exporter {
                    pid: 9,
                    rank: None,
                    job: Some(t("slurm:99.1")),
                    gpu: Some(t("GPU-x")),
                    location: t("device"),
                    rank_root: Some(RootRef {
                        pid: 8,
                        start: 5,
                        host: Some(t("node-1")),
                    }),
                }),
            },
            site: Some(t("train.py:7 in place\n")),
            py_stack: Cow::Owned(vec!["a.py:1 in <module>".into(), "é\t.py:2 in f".into()]),
            py_stack_cut: true,
            native_stack: Cow::Owned(vec!["libx.so(f+0x10)".into()]),
            native_stack_cut: false,
            summary: None,
        }
    }

    /// Every fact survives render -> parse, and rendering the parsed record again gives
    /// the same bytes.
    #[test]
    fn records_round_trip_byte_for_byte() {
        let mut cases = vec![full()];
        for fields in [
            RuleFields::None,
            RuleFields::Init {
                devices: 2,
                entries: 2,
                sees: None,
            },
            RuleFields::Init {
                devices: 1,
                entries: 1,
                sees: Some(t("GPU-1")),
            },
            RuleFields::Mapping { device: 3 },
            RuleFields::Import {
                handle: None,
                key: None,
                decision: t("unknown exporter"),
                exporter: None,
            },
        ] {
            cases.push(AuditRecord {
                rule_fields: fields,
                ..full()
            });
        }
        cases.push(AuditRecord {
            ts_us: Some(1_000_000),
            summary: Some(Summary {
                count: 7,
                since_us: Some(999_999),
            }),
            call: t("cudaSetDevice"),
            abi: Some(t("cudaSetDevice")),
            action: Some(Action::Warn),
            rule: Some(RuleId::Known(Rule::R2)),
            mode: Some(Mode::Warn),
            pid: Some(1),
            host: Some(t("h")),
            site: Some(t("x.py:1 in f")),
            ..AuditRecord::default()
        });
        // A rule this build does not know is kept under its id.
        cases.push(AuditRecord {
            rule: Some(RuleId::Other(t("R9"))),
            ..full()
        });
        for r in cases {
            let line = render(&r);
            assert!(
                line.ends_with("}\n") && line.matches('\n').count() == 1,
                "{line}"
            );
            let back = AuditRecord::parse(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            let mut want = r.clone();
            if want.summary.is_some() {
                // A summary carries no per-call facts and no stacks.
                want.py_stack = Cow::Owned(Vec::new());
                want.native_stack = Cow::Owned(Vec::new());
            }
            assert_eq!(back, want, "{line}");
            assert_eq!(render(&back), line);
        }
    }

    #[test]
    fn an_oversized_field_carries_the_marker_and_stays_one_json_line() {
        let huge = "x\"\u{1}é".repeat(10_000);
        let r = AuditRecord {
            args: Some(Cow::Owned(huge.clone())),
            site: Some(Cow::Owned(huge.clone())),
            detail: Some(Cow::Owned(huge.clone())),
            ..full()
        };
        let line = render(&r);
        assert!(line.len() <= RECORD_MAX && line.ends_with("}\n"));
        assert_eq!(line.matches('\n').count(), 1);
        parse_json(&line).unwrap();
        let back = AuditRecord::parse(&line).unwrap();
        for v in [back.args.unwrap(), back.site.unwrap(), back.detail.unwrap()] {
            assert!(v.ends_with(CUT_MARK), "{v}");
            assert!(huge.starts_with(&v[..v.len() - CUT_MARK.len()]));
        }
        // The stderr line cuts the same way.
        let mut s = String::new();
        r.write_line(&mut s).unwrap();
        assert!(s.contains(CUT_MARK) && s.ends_with('\n') && s.matches('\n').count() == 1);
        assert!(s.len() < 4096, "{}", s.len());
    }

    #[test]
    fn stacks_are_cut_whole_frames_within_the_record_limit() {
        // Frames of control characters: each escapes to six bytes per source byte.
        let nasty = "\u{1}".repeat(caps::FRAME * 2);
        let r = AuditRecord {
            py_stack: Cow::Owned(vec![nasty.clone(); 64]),
            py_stack_cut: false,
            native_stack: Cow::Owned(vec![nasty; 64]),
            ..full()
        };
        let line = render(&r);
        assert!(line.len() <= RECORD_MAX, "{}", line.len());
        let back = AuditRecord::parse(&line).unwrap();
        assert!(back.py_stack_cut && back.native_stack_cut);
        assert!(!back.py_stack.is_empty() && back.py_stack.len() < 64);
        assert!(back.py_stack.iter().all(|f| f.ends_with(CUT_MARK)));
        // A small buffer (the guard's fallback): fewer frames, still whole.
        let mut small = [0u8; 4096];
        let mut w = FixedWriter::new(&mut small);
        r.write_json(&mut w).unwrap();
        let back = AuditRecord::parse(std::str::from_utf8(w.as_bytes()).unwrap()).unwrap();
        assert!(back.py_stack.len() <= 1 && back.py_stack_cut && back.native_stack_cut);
        // Too small for even that: nothing is written.
        let mut tiny = [0u8; 64];
        let mut w = FixedWriter::new(&mut tiny);
        assert!(r.write_json(&mut w).is_err() && w.is_empty());
    }

    #[test]
    fn the_line_says_what_the_record_says() {
        let mut s = String::new();
        full().write_line(&mut s).unwrap();
        assert_eq!(
            s,
            "cuDeviceGet(device=0x7ffd, ordinal=1) denied [R2 cuda:0 only]: device ordinal 1 is not 0; \
             CUDA_VISIBLE_DEVICES=GPU-\\xff,1, rank GPU GPU-12c0ffee-0000-4000-8000-000000000002; the mem \
             handle was exported by pid 9 (rank root 8) on GPU-x, imported here on \
             GPU-12c0ffee-0000-4000-8000-000000000002; at train.py:7 in place\n; fix: "
                .to_string()
                + Rule::R2.fix()
                + "\n"
        );
    }

    /// The worst record without stacks fits FIXED_MAX, for every kind of rule fields.
    #[test]
    fn rendered_whole_in_fixed_max() {
        let worst = |cap: usize| -> Text<'static> { Cow::Owned("\u{1}".repeat(cap + 1)) };
        let root = || RootRef {
            pid: u32::MAX,
            // clock ticks since boot: far below what a JSON number holds exactly
            start: 1 << 50,
            host: Some(worst(caps::HOST)),
        };
        let kinds = [
            RuleFields::Init {
                devices: i32::MIN,
                entries: u32::MAX,
                sees: Some(worst(caps::GPU)),
            },
            RuleFields::Import {
                handle: Some(worst(caps::HANDLE)),
                key: Some(worst(caps::KEY)),
                decision: worst(caps::DECISION),
                exporter: Some(Exporter {
                    pid: u32::MAX,
                    rank: Some(u32::MAX),
                    job: Some(worst(caps::JOB)),
                    gpu: Some(worst(caps::GPU)),
                    location: worst(caps::LOCATION),
                    rank_root: Some(root()),
                }),
            },
            RuleFields::Mapping { device: i32::MIN },
        ];
        for fields in kinds {
            let r = AuditRecord {
                ts_us: Some(u64::MAX),
                call: worst(caps::CALL),
                abi: Some(worst(caps::CALL)),
                action: Some(Action::Deny),
                rule: Some(RuleId::Other(worst(caps::CALL))),
                mode: Some(Mode::Enforce),
                pid: Some(u32::MAX),
                tid: Some(u32::MAX),
                host: Some(worst(caps::HOST)),
                rank: Some(u32::MAX),
                local_rank: Some(u32::MAX),
                job: Some(worst(caps::JOB)),
                rank_root: Some(root()),
                ordinal: Some(i32::MIN),
                cvd: Some(worst(caps::CVD)),
                gpu: Some(worst(caps::GPU)),
                rank_gpu: Some(worst(caps::RANK_GPU)),
                rank_gpu_uuid: Some(worst(caps::RANK_GPU)),
                args: Some(worst(caps::ARGS)),
                detail: Some(worst(caps::DETAIL)),
                rule_fields: fields,
                site: Some(worst(caps::SITE)),
                ..AuditRecord::default()
            };
            let mut buf = vec![0u8; FIXED_MAX];
            let mut w = FixedWriter::new(&mut buf);
            r.write_json(&mut w).unwrap();
            let back = AuditRecord::parse(std::str::from_utf8(w.as_bytes()).unwrap()).unwrap();
            assert!(back.args.unwrap().ends_with(CUT_MARK));
            // A summary of the same fields fits too.
            let s = AuditRecord {
                summary: Some(Summary {
                    count: u64::MAX >> 12,
                    since_us: Some(u64::MAX),
                }),
                ..r
            };
            let mut w = FixedWriter::new(&mut buf);
            s.write_json(&mut w).unwrap();
        }
    }

    fn map() -> MapRecord<'static> {
        MapRecord {
            ts_us: Some(1_764_527_000_123_456),
            host: Some(t("node7")),
            pid: 4242,
            start: Some(987_654),
            rank: None,
            local_rank: None,
            job: Some(t("torchelastic:r1")),
            rank_root: Some(RootRef {
                pid: 4242,
                start: 987_654,
                host: Some(t("node7")),
            }),
            mode: Some(Mode::Warn),
            cvd: Some(t("5")),
            cvd_start: Some(t("2")),
            devices: 1,
            gpu: Some(t("GPU-15c0ffee-0000-4000-8000-000000000005")),
            rank_gpu: Some(t("2")),
            rank_gpu_uuid: None,
            r1: Some(MapR1::Warn),
        }
    }

    /// The map record's members in docs/report.md's order, round-tripped byte for byte, and
    /// its debug sentence.
    #[test]
    fn map_records_round_trip_and_read_as_a_sentence() {
        let mut buf = vec![0u8; MAP_MAX];
        let mut w = FixedWriter::new(&mut buf);
        map().write_json(&mut w).unwrap();
        let line = std::str::from_utf8(w.as_bytes()).unwrap().to_string();
        assert_eq!(
            line,
            "{\"format\":\"rankguard-audit\",\"version\":1,\"kind\":\"map\",\"ts\":1764527000.123456,\
             \"host\":\"node7\",\"pid\":4242,\"start\":987654,\"rank\":null,\"local_rank\":null,\
             \"job\":\"torchelastic:r1\",\"rank_root\":{\"pid\":4242,\"start\":987654,\"host\":\"node7\"},\
             \"mode\":\"warn\",\"cvd\":\"5\",\"cvd_start\":\"2\",\"devices\":1,\
             \"gpu\":\"GPU-15c0ffee-0000-4000-8000-000000000005\",\"rank_gpu\":\"2\",\"rank_gpu_uuid\":null,\
             \"r1\":\"warn\"}\n"
        );
        assert_eq!(parse_line(&line), Ok(Line::Map(Box::new(map()))));
        assert_eq!(MapRecord::parse(&line), Ok(map()));
        // a decision record is not a map record, and the other way round
        assert!(MapRecord::parse(&render(&full())).is_err());
        assert!(matches!(
            parse_line(&render(&full())),
            Ok(Line::Decision(_))
        ));
        assert!(AuditRecord::parse(&line).is_err());
        let mut s = String::new();
        map().write_line(&mut s).unwrap();
        assert_eq!(
            s,
            "GPU map: pid 4242 (its own rank root) sees GPU-15c0ffee-0000-4000-8000-000000000005 \
             (1 device; CUDA_VISIBLE_DEVICES=5, started with 2); rank GPU 2; R1 broken: let run (warn mode)\n"
        );
        let unset = MapRecord {
            rank: Some(3),
            cvd: None,
            cvd_start: None,
            devices: 8,
            gpu: None,
            rank_gpu: None,
            r1: Some(MapR1::Deny),
            ..map()
        };
        let mut s = String::new();
        unset.write_line(&mut s).unwrap();
        assert_eq!(
            s,
            "GPU map: pid 4242 (rank 3) sees no single identifiable GPU (8 devices; \
             CUDA_VISIBLE_DEVICES=<unset>, started with <unset>); R1 broken: stopped\n"
        );
    }

    /// The worst map record (every text at its cap, escaped six-fold) fits MAP_MAX.
    #[test]
    fn map_record_fits() {
        let worst = |cap: usize| -> Text<'static> { Cow::Owned("\u{1}".repeat(cap + 1)) };
        let m = MapRecord {
            ts_us: Some(u64::MAX),
            host: Some(worst(caps::HOST)),
            pid: u32::MAX,
            // clock ticks since boot: far below what a JSON number holds exactly
            start: Some(1 << 50),
            rank: Some(u32::MAX),
            local_rank: Some(u32::MAX),
            job: Some(worst(caps::JOB)),
            rank_root: Some(RootRef {
                pid: u32::MAX,
                start: 1 << 50,
                host: Some(worst(caps::HOST)),
            }),
            mode: Some(Mode::Enforce),
            cvd: Some(worst(caps::CVD)),
            cvd_start: Some(worst(caps::CVD)),
            devices: i32::MIN,
            gpu: Some(worst(caps::GPU)),
            rank_gpu: Some(worst(caps::RANK_GPU)),
            rank_gpu_uuid: Some(worst(caps::RANK_GPU)),
            r1: Some(MapR1::Deny),
        };
        let mut buf = vec![0u8; MAP_MAX];
        let mut w = FixedWriter::new(&mut buf);
        m.write_json(&mut w).unwrap();
        let back = MapRecord::parse(std::str::from_utf8(w.as_bytes()).unwrap()).unwrap();
        assert!(back.cvd.unwrap().ends_with(CUT_MARK));
    }

    #[test]
    fn json_strings_escape_and_cap() {
        let mut s = String::new();
        json_str(&mut s, "a\"b\\c\nd\u{1}", 64).unwrap();
        assert_eq!(s, r#""a\"b\\c\nd\u0001""#);
        let mut s = String::new();
        json_str(&mut s, "ééééé", 5).unwrap();
        assert_eq!(s, format!("\"éé{CUT_MARK}\""));
    }
}
