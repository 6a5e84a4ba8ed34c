//! Reading `RANKGUARD_AUDIT` files back: what `rankguard report` aggregates.
//!
//! The guard appends one JSON object per line per decision (the typed record of
//! [`crate::record`], parsed back here by [`parse_record`]). A job leaves one file per rank, host or process (`%h`, `%p`), so this
//! module takes the lines of many files and groups them the way a person debugging a legacy
//! config reads them: by rule, then call, then rank, with counts and the first occurrence.
//!
//! Pure and safe: no I/O here (the command in `cli/report.rs` reads the files), so every
//! rule of the aggregation is unit-tested below. A line that cannot be used (torn by a
//! killed writer, not JSON, not an audit record) becomes a [`Problem`] naming file:line and
//! why; it never stops the report.
//!
//! Decided here (the audit format leaves it open):
//! - a record needs `call`, `rule` and `verdict`; every other field is optional, so records
//!   of older or newer guards still count (unknown fields are ignored, unknown rules are
//!   kept under their own name);
//! - "first occurrence" is the smallest `ts`; equal or missing times fall back to input
//!   order (file order as given, then line order);
//! - a record with `rank: null` (no RANK/LOCAL_RANK/... in its environment) is grouped by
//!   its `rank_root` (the process whose tree is the rank, [`crate::rank_root`]): one group
//!   per (host, pid, start time), listed after the numbered ranks; records with neither
//!   are grouped under "rank -", listed last;
//! - an empty line is not a problem (nothing was written there), a line without its final
//!   newline that fails to parse is reported as torn;
//! - every record starts with [`RECORD_START`], and a record is whole or absent (issue 29,
//!   item 7): a line that holds a record's start after other text is a fragment (a write
//!   that the file system cut short) with a later record glued to it. The line is split at
//!   each record start: the fragment is one torn record (a problem), the record after it is
//!   kept.

use std::collections::{BTreeMap, BTreeSet};

use std::borrow::Cow;

use crate::json::Json;
use crate::record::{self, Action, AuditRecord, RuleFields, Text};

use crate::policy::Rule;

/// The human name of a rule id as a record spells it ([`Rule::name`], the guard's own
/// words); an id this build does not know is said as such.
pub fn rule_name(rule: &str) -> &'static str {
    Rule::parse(rule).map_or(
        "a rule this rankguard does not know (newer guard?)",
        Rule::name,
    )
}

// ---------------------------------------------------------------------------------------
// Records

/// One audit record as the report aggregates it: the facts of an [`AuditRecord`] it
/// groups and prints, with every text owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub ts: Option<f64>,
    pub call: String,
    pub abi: Option<String>,
    pub verdict: String,
    pub rule: String,
    pub mode: Option<String>,
    pub pid: Option<i64>,
    pub host: Option<String>,
    pub rank: Option<i64>,
    /// The rank root when no rank variable named the rank.
    pub rank_root: Option<ParsedRoot>,
    pub job: Option<String>,
    pub ordinal: Option<i64>,
    pub cvd: Option<String>,
    pub gpu: Option<String>,
    /// The rank's GPU as the record names it: the entry the launcher gave (or the rank
    /// root's), and its full UUID when the launcher resolved it.
    pub rank_gpu: Option<String>,
    pub rank_gpu_uuid: Option<String>,
    /// R1 at `cuInit`: the GPU the process saw (`sees`), and how many devices (`devices`).
    pub sees: Option<String>,
    pub devices: Option<i64>,
    pub args: Option<String>,
    pub detail: Option<String>,
    /// R3: who exported the imported handle (`exporter_*` fields, `guard/7_decide/ipc.rs`).
    pub exporter: Option<ParsedExporter>,
    /// Where the call came from (`guard/6_audit/site.rs`): `FILE:LINE in FUNCTION` or
    /// `OBJECT(SYMBOL+0xOFF)`; absent in records of older guards.
    pub site: Option<String>,
    /// Python frames `FILE:LINE in FUNCTION`, outermost first (empty without Python).
    pub py_stack: Vec<String>,
    /// Violations this record stands for: 1, or a summary record's `count`.
    pub count: u64,
    /// A summary record (`"summary":true`): `count` occurrences after the site's first
    /// full records, with no arguments of their own.
    pub summary: bool,
}

/// The exporter of an IPC/VMM handle, as the guard's provenance record knew it, parsed
/// back from an audit record (the guard writes it as [`record::Exporter`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedExporter {
    pub pid: Option<i64>,
    pub rank: Option<i64>,
    pub job: Option<String>,
    pub gpu: Option<String>,
    pub location: Option<String>,
    pub rank_root: Option<ParsedRoot>,
}

/// A rank root as a record names it, parsed back: `{"pid":P,"start":S,"host":"H"}`
/// (the guard writes it as [`record::RootRef`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ParsedRoot {
    pub host: Option<String>,
    pub pid: i64,
    pub start: i64,
}

impl ParsedRoot {
    /// `host:pid`, as the report names the rank.
    pub fn label(&self) -> String {
        format!("{}:{}", self.host.as_deref().unwrap_or("?"), self.pid)
    }
}

impl From<AuditRecord<'static>> for Row {
    fn from(r: AuditRecord<'static>) -> Row {
        let s = |t: Option<Text<'static>>| t.map(Cow::into_owned);
        let root = |r: Option<record::RootRef<'static>>| {
            r.map(|r| ParsedRoot {
                host: s(r.host),
                pid: r.pid.into(),
                start: r.start as i64,
            })
        };
        let rule = r.rule_str().to_string();
        let (sees, devices) = match &r.rule_fields {
            RuleFields::Init { sees, devices, .. } => (
                sees.as_ref().map(|t| t.to_string()),
                Some(i64::from(*devices)),
            ),
            _ => (None, None),
        };
        let exporter = match r.rule_fields {
            RuleFields::Import { exporter, .. } => Some(exporter.map_or_else(
                ParsedExporter::default,
                |x| ParsedExporter {
                    pid: Some(x.pid.into()),
                    rank: x.rank.map(i64::from),
                    job: s(x.job),
                    gpu: s(x.gpu),
                    location: Some(x.location.into_owned()),
                    rank_root: root(x.rank_root),
                },
            )),
            _ => None,
        };
        Row {
            ts: r.ts_us.map(|us| us as f64 / 1e6),
            call: r.call.into_owned(),
            abi: s(r.abi),
            verdict: r.action.map_or("?", Action::as_str).to_string(),
            rule,
            mode: r.mode.map(|m| m.as_str().to_string()),
            pid: r.pid.map(i64::from),
            host: s(r.host),
            rank: r.rank.map(i64::from),
            rank_root: root(r.rank_root),
            job: s(r.job),
            ordinal: r.ordinal.map(i64::from),
            cvd: s(r.cvd),
            gpu: s(r.gpu),
            rank_gpu: s(r.rank_gpu),
            rank_gpu_uuid: s(r.rank_gpu_uuid),
            sees,
            devices,
            args: s(r.args),
            detail: s(r.detail),
            exporter,
            site: s(r.site),
            py_stack: r.py_stack.into_owned(),
            count: r.summary.map_or(1, |x| x.count),
            summary: r.summary.is_some(),
        }
    }
}

/// The record in one audit line, as the report aggregates it ([`AuditRecord::parse`]).
pub fn parse_record(line: &str) -> Result<Row, String> {
    AuditRecord::parse(line).map(Row::from)
}

// ---------------------------------------------------------------------------------------
// GPU map records

/// The `kind` of a GPU map record: one per guarded process, written at its first `cuInit`,
/// saying which GPU it saw (docs/report.md, "The GPU map"). Every other line is a decision
/// record (which carries no `kind`, or one this build reads as a decision).
pub const MAP_KIND: &str = "map";

/// One process's GPU map record. Read tolerantly: only `kind` is required, unknown fields
/// are ignored, and the GPU, its index and the rank root are taken from the names a guard
/// may give them (`gpu`/`uuid`/`gpu_uuid`, `index`/`gpu_index`/`ordinal`,
/// `rank_root`/`root`/`root_pid`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MapRow {
    pub ts: Option<f64>,
    pub host: Option<String>,
    pub pid: Option<i64>,
    pub rank: Option<i64>,
    pub local_rank: Option<i64>,
    /// The process's rank root (its pid; the start time when the record gives it, else 0).
    pub rank_root: Option<ParsedRoot>,
    /// The GPU the process sees, by UUID.
    pub gpu: Option<String>,
    /// That GPU's index as the record gives it.
    pub index: Option<i64>,
    pub cvd: Option<String>,
    pub mode: Option<String>,
    pub job: Option<String>,
}

fn map_bad(key: &str, what: &str) -> String {
    format!("not a GPU map record: field '{key}' is not {what}")
}

/// The first of `keys` present and not null.
fn first_of<'v>(v: &'v Json, keys: &[&'static str]) -> Option<(&'static str, &'v Json)> {
    keys.iter()
        .find_map(|k| v.get(k).filter(|x| **x != Json::Null).map(|x| (*k, x)))
}

fn map_str(v: &Json, keys: &[&'static str]) -> Result<Option<String>, String> {
    match first_of(v, keys) {
        None => Ok(None),
        Some((_, Json::Str(s))) => Ok(Some(s.clone())),
        Some((k, _)) => Err(map_bad(k, "a string")),
    }
}

fn json_int(x: &Json) -> Option<i64> {
    match x {
        Json::Num(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => Some(*n as i64),
        _ => None,
    }
}

fn map_int(v: &Json, keys: &[&'static str]) -> Result<Option<i64>, String> {
    match first_of(v, keys) {
        None => Ok(None),
        Some((k, x)) => json_int(x)
            .map(Some)
            .ok_or_else(|| map_bad(k, "an integer")),
    }
}

/// A GPU map record ([`MAP_KIND`]) from its JSON object.
pub fn parse_map(v: &Json) -> Result<MapRow, String> {
    let host = map_str(v, &["host"])?;
    let root = match first_of(v, &["rank_root", "root"]) {
        Some((_, o @ Json::Obj(_))) => {
            let pid = o.get("pid").and_then(json_int);
            let Some(pid) = pid else {
                return Err(map_bad("rank_root", "a rank root {pid, start, host}"));
            };
            Some(ParsedRoot {
                host: map_str(o, &["host"])?.or_else(|| host.clone()),
                pid,
                start: o.get("start").and_then(json_int).unwrap_or(0),
            })
        }
        Some((k, x)) => Some(ParsedRoot {
            host: host.clone(),
            pid: json_int(x).ok_or_else(|| map_bad(k, "a pid or a rank root"))?,
            start: map_int(v, &["root_start"])?.unwrap_or(0),
        }),
        None => map_int(v, &["root_pid"])?.map(|pid| ParsedRoot {
            host: host.clone(),
            pid,
            start: 0,
        }),
    };
    let ts = match first_of(v, &["ts"]) {
        None => None,
        Some((_, Json::Num(n))) if n.is_finite() && *n >= 0.0 => Some(*n),
        Some((k, _)) => return Err(map_bad(k, "a time in seconds")),
    };
    Ok(MapRow {
        ts,
        pid: map_int(v, &["pid"])?,
        rank: map_int(v, &["rank"])?,
        local_rank: map_int(v, &["local_rank"])?,
        rank_root: root,
        gpu: map_str(v, &["gpu", "uuid", "gpu_uuid", "sees"])?,
        index: map_int(v, &["index", "gpu_index", "ordinal", "device"])?,
        cvd: map_str(v, &["cvd"])?,
        mode: map_str(v, &["mode"])?,
        job: map_str(v, &["job"])?,
        host,
    })
}

/// One line of an audit file: a decision record or a GPU map record.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Record(Box<Row>),
    Map(Box<MapRow>),
}

/// Whichever record one audit line holds.
pub fn parse_line(line: &str) -> Result<Line, String> {
    let v = record::json_line(line)?;
    if v.get("kind") == Some(&Json::Str(MAP_KIND.to_string())) {
        return parse_map(&v).map(|m| Line::Map(Box::new(m)));
    }
    AuditRecord::from_json(&v).map(|r| Line::Record(Box::new(Row::from(r))))
}

// ---------------------------------------------------------------------------------------
// Aggregation

/// A line or file the report could not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    /// 1-based line number; `None` for the whole file (unreadable).
    pub line: Option<usize>,
    pub why: String,
}

/// Where a record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub line: usize,
}

/// The violations of one rank for one (rule, call).
#[derive(Debug, Clone)]
pub struct RankStats {
    pub rank: Option<i64>,
    /// The rank root of a rank with no number (`rank` None).
    pub rank_root: Option<ParsedRoot>,
    pub count: usize,
    pub denied: usize,
    pub warned: usize,
    /// Distinct (host, pid) pairs.
    pub processes: usize,
    pub first: Row,
    pub first_at: Origin,
}

/// One (rule, call) group.
#[derive(Debug, Clone)]
pub struct Group {
    pub rule: String,
    pub call: String,
    pub count: usize,
    pub denied: usize,
    pub warned: usize,
    /// Numbered ranks ascending, then rank roots, then rank "-".
    pub ranks: Vec<RankStats>,
    /// Call sites, most violations first (ties: site text; records without one last).
    pub sites: Vec<SiteStats>,
}

/// The violations of one (rule, call) from one call site, across ranks and processes.
#[derive(Debug, Clone)]
pub struct SiteStats {
    /// `None`: records that name no site (older guards, or none could be found).
    pub site: Option<String>,
    pub count: usize,
    pub denied: usize,
    pub warned: usize,
    /// Numbered ranks ascending, then rank "-" (`None`: every rank without a number).
    pub ranks: Vec<Option<i64>>,
    /// Every rank of the site, named as the report names ranks ([`RankKey::label`]).
    pub rank_keys: Vec<RankKey>,
    pub processes: usize,
    pub first: Row,
    pub first_at: Origin,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Violations: full records plus the counts of summary records.
    pub records: usize,
    /// Summary records read (each stands for `count` violations).
    pub summaries: usize,
    pub denied: usize,
    pub warned: usize,
    pub groups: usize,
    pub ranks: usize,
    pub processes: usize,
    /// Every unusable line and unreadable file, listed or not.
    pub problems: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Aggregate {
    pub groups: Vec<Group>,
    /// The problems listed: per file its first [`LISTED_PER_FILE`], then one entry counting
    /// the rest of its lines; [`LISTED_MAX`] entries at most.
    pub problems: Vec<Problem>,
    pub totals: Totals,
    /// Whole files that could not be read.
    pub unreadable: usize,
    /// Problems (counted in `totals.problems`) that no entry of `problems` names, the list
    /// being full ([`LISTED_MAX`]).
    pub unlisted: usize,
    /// The GPU map: every process a map record or a violation names, by rank, then host
    /// and pid.
    pub map: Vec<MapProc>,
    /// GPU map records read.
    pub map_records: usize,
}

/// One process of the GPU map (`rankguard report --map`).
#[derive(Debug, Clone, PartialEq)]
pub struct MapProc {
    /// Its rank; a rank root's start time is left out (0): the map names roots by host:pid.
    pub rank: RankKey,
    pub host: Option<String>,
    pub pid: Option<i64>,
    pub root_pid: Option<i64>,
    /// The GPU it saw: its map record's, else its first violation's `gpu`.
    pub gpu: Option<String>,
    pub index: Option<i64>,
    pub cvd: Option<String>,
    pub mode: Option<String>,
    pub job: Option<String>,
    /// A map record named it (false: known only from its violations).
    pub mapped: bool,
    /// The rules it broke, in rule order, with its violations of each.
    pub broke: Vec<(String, usize)>,
}

/// What the violations of one process say about it, for the map.
#[derive(Default)]
struct ProcSeen {
    rank: Option<RankKey>,
    gpu: Option<String>,
    cvd: Option<String>,
    mode: Option<String>,
    job: Option<String>,
    rules: BTreeMap<RuleKey, (String, usize)>,
}

/// A rank key as the map groups it: a root by host and pid only (a map record may not
/// carry the root's start time).
fn map_rank(k: RankKey) -> RankKey {
    match k {
        RankKey::Root(r) => RankKey::Root(ParsedRoot { start: 0, ..r }),
        k => k,
    }
}

/// A rank as the report groups and names it. Order: numbered ranks ascending, then rank
/// roots (by host, pid, start time), then "no rank".
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RankKey {
    Numbered(i64),
    Root(ParsedRoot),
    Unknown,
}

impl RankKey {
    pub fn of(rank: Option<i64>, root: Option<&ParsedRoot>) -> RankKey {
        match (rank, root) {
            (Some(n), _) => RankKey::Numbered(n),
            (None, Some(root)) => RankKey::Root(root.clone()),
            (None, None) => RankKey::Unknown,
        }
    }

    /// The one way a rank is named everywhere in a report (header, sites, map, `launch`'s
    /// summary): its number; a rank with no number by its rank root, `root host:pid`; `-`
    /// for records that name neither (older guards).
    pub fn label(&self) -> String {
        match self {
            RankKey::Numbered(n) => n.to_string(),
            RankKey::Root(root) => format!("root {}", root.label()),
            RankKey::Unknown => "-".to_string(),
        }
    }
}

fn rank_key(r: &Row) -> RankKey {
    RankKey::of(r.rank, r.rank_root.as_ref())
}

/// `rank 3` or `ranks 0-7, 9, root h:20`: numbered ranks in order with runs of three or more
/// written as ranges (Slurm's node lists do the same), then the others by their labels.
/// `keys` sorted as [`RankKey`] orders them, without repeats.
pub fn rank_list(keys: &[RankKey]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let nums: Vec<i64> = keys
        .iter()
        .filter_map(|k| match k {
            RankKey::Numbered(n) => Some(*n),
            _ => None,
        })
        .collect();
    let mut i = 0;
    while i < nums.len() {
        let mut j = i;
        while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", nums[i], nums[j]));
        } else {
            parts.extend(nums[i..=j].iter().map(|n| n.to_string()));
        }
        i = j + 1;
    }
    parts.extend(
        keys.iter()
            .filter(|k| !matches!(k, RankKey::Numbered(_)))
            .map(RankKey::label),
    );
    format!(
        "{} {}",
        if keys.len() == 1 { "rank" } else { "ranks" },
        parts.join(", ")
    )
}

/// Rule order: R1, R2, ... numerically, then unknown rule names alphabetically.
fn rule_key(rule: &str) -> (u32, String) {
    match rule.strip_prefix('R').and_then(|n| n.parse::<u32>().ok()) {
        Some(n) => (n, String::new()),
        None => (u32::MAX, rule.to_string()),
    }
}

#[derive(Default)]
struct Acc {
    count: usize,
    denied: usize,
    warned: usize,
    procs: BTreeSet<(Option<String>, Option<i64>)>,
    ranks: BTreeSet<RankKey>,
    first: Option<(Row, Origin, usize)>,
}

impl Acc {
    fn add(&mut self, r: &Row, at: &Origin, seq: usize) {
        let n = r.count as usize;
        self.count += n;
        if r.verdict == "deny" {
            self.denied += n;
        } else {
            self.warned += n;
        }
        self.procs.insert((r.host.clone(), r.pid));
        self.ranks.insert(rank_key(r));
        // A summary record (no arguments of its own) is a first occurrence only where no
        // full record is known.
        let earlier = match &self.first {
            None => true,
            Some((f, _, _)) if f.summary != r.summary => f.summary,
            Some((f, _, fseq)) => match (r.ts, f.ts) {
                (Some(t), Some(ft)) if t != ft => t < ft,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                _ => seq < *fseq,
            },
        };
        if earlier {
            self.first = Some((r.clone(), at.clone(), seq));
        }
    }
}

/// A rule as the report sorts it: (order, name).
type RuleKey = (u32, String);

/// Problems listed one by one per file; the rest of a file's unusable lines are counted in
/// one entry for the file (docs/report.md). A core dump in a job directory has millions of
/// "lines": the report names a sample and counts the rest, in memory that does not grow.
pub const LISTED_PER_FILE: usize = 10;
/// Entries in the problem list in all (samples, per-file counts, unreadable files); the
/// problems past them are only counted (`Aggregate::unlisted`).
pub const LISTED_MAX: usize = 100;
/// A listed reason is cut to this many bytes (a reason can quote the input).
pub const WHY_MAX: usize = 240;

/// The unusable lines of the file being read, past its listed sample.
#[derive(Default)]
struct FileProblems {
    file: String,
    listed: usize,
    more: usize,
    first_more: usize,
    last_more: usize,
}

/// Builds an [`Aggregate`] from files' lines, in the order they are given.
#[derive(Default)]
pub struct Aggregator {
    acc: BTreeMap<(RuleKey, String, RankKey), Acc>,
    sites: BTreeMap<(RuleKey, String, Option<String>), Acc>,
    summaries: usize,
    /// The listed problems (at most [`LISTED_MAX`]).
    problems: Vec<Problem>,
    /// Every problem, listed or not.
    problem_count: usize,
    /// Problems named by no entry of `problems`.
    unlisted: usize,
    cur: FileProblems,
    seq: usize,
    unreadable: usize,
    procs: BTreeSet<(Option<String>, Option<i64>)>,
    ranks: BTreeSet<RankKey>,
    /// GPU map records by (host, pid): the earliest of each process.
    maps: BTreeMap<(Option<String>, Option<i64>), MapRow>,
    map_records: usize,
    /// Per process (host, pid), what its violations say (for the map).
    seen: BTreeMap<(Option<String>, Option<i64>), ProcSeen>,
    /// Only records of this job count (`launch`'s summary); others are skipped unread.
    only_job: Option<String>,
}

/// Processes kept for `report --map` (one map record each: a job of thousands of processes
/// fits); the map records of processes past it are only counted (`Aggregate::map_records`),
/// so memory stays bounded whatever the input.
pub const MAPS_MAX: usize = 65_536;

/// `why` cut to [`WHY_MAX`] bytes at a character boundary, marked as cut.
fn cut_why(mut why: String) -> String {
    if why.len() > WHY_MAX {
        let mut end = WHY_MAX;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push_str("...");
    }
    why
}

/// How every record the guard writes begins (`crate::record`'s `write_json`; the schema's
/// first field, docs/schema/audit-record.v1.json). Inside a JSON string a quote is
/// escaped, so this text never occurs inside a record, only at its start.
pub const RECORD_START: &str = "{\"format\":\"rankguard-audit\"";

/// Where [`RECORD_START`] first occurs in `b`.
fn find_record_start(b: &[u8]) -> Option<usize> {
    let pat = RECORD_START.as_bytes();
    b.windows(pat.len()).position(|w| w == pat)
}

/// What part of a line a piece is (see [`Aggregator::add_line`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// A whole line (it ended with a newline).
    Line,
    /// The file's last line, with no final newline.
    LastLine,
    /// Text followed on the same line by a record's start.
    BeforeRecord,
}

impl Aggregator {
    pub fn new() -> Self {
        Self::default()
    }

    /// An aggregator that keeps only the records of `job` (their `job` field): `launch`
    /// reads a shared audit directory for its own job's summary. Records of other jobs,
    /// and records that name no job, are passed over (neither counted nor problems).
    pub fn for_job(job: &str) -> Self {
        Aggregator {
            only_job: Some(job.to_string()),
            ..Self::default()
        }
    }

    /// A file that could not be read at all.
    pub fn unreadable(&mut self, file: &str, why: String) {
        self.unreadable += 1;
        self.problem(file, None, why);
    }

    /// Line `n` of `file` could not be used (also for lines skipped unread, too long to be
    /// records). Counted always; listed while the file's sample and the list have room.
    pub fn line_problem(&mut self, file: &str, n: usize, why: String) {
        self.problem(file, Some(n), why);
    }

    fn problem(&mut self, file: &str, line: Option<usize>, why: String) {
        self.problem_count += 1;
        if self.cur.file != file {
            self.end_file();
            self.cur.file = file.to_string();
        }
        match line {
            Some(n) if self.cur.listed >= LISTED_PER_FILE => {
                if self.cur.more == 0 {
                    self.cur.first_more = n;
                }
                self.cur.more += 1;
                self.cur.last_more = n;
            }
            _ => {
                if line.is_some() {
                    self.cur.listed += 1;
                }
                self.list(Problem {
                    file: file.to_string(),
                    line,
                    why: cut_why(why),
                });
            }
        }
    }

    /// Lists `p` if the list has room, else counts it as unlisted.
    fn list(&mut self, p: Problem) {
        if self.problems.len() < LISTED_MAX {
            self.problems.push(p);
        } else {
            self.unlisted += 1;
        }
    }

    /// The count entry of the file whose problems came last, if it had more than its sample.
    fn end_file(&mut self) {
        let c = std::mem::take(&mut self.cur);
        if c.more == 0 {
            return;
        }
        if self.problems.len() < LISTED_MAX {
            self.problems.push(Problem {
                why: format!(
                    "{} more unusable {} not listed (lines {} to {}; the first {LISTED_PER_FILE} are listed)",
                    c.more,
                    if c.more == 1 { "line" } else { "lines" },
                    c.first_more,
                    c.last_more
                ),
                file: c.file,
                line: Some(c.first_more),
            });
        } else {
            self.unlisted += c.more;
        }
    }

    /// The whole content of one file (the command streams lines with `add_line`).
    #[cfg(test)]
    pub fn add_file(&mut self, file: &str, bytes: &[u8]) {
        let mut rest = bytes;
        let mut n = 0;
        while !rest.is_empty() {
            n += 1;
            let (line, complete) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let l = &rest[..i];
                    rest = &rest[i + 1..];
                    (l, true)
                }
                None => {
                    let l = rest;
                    rest = &[];
                    (l, false)
                }
            };
            self.add_line(file, n, line, complete);
        }
    }

    /// One line (without its newline); `complete` is false for a last line that had none.
    /// Resynchronises at each [`RECORD_START`] inside the line (see the module's notes).
    pub fn add_line(&mut self, file: &str, n: usize, mut line: &[u8], complete: bool) {
        while let Some(i) = line.get(1..).and_then(find_record_start) {
            let (head, tail) = line.split_at(i + 1);
            self.add_piece(file, n, head, Piece::BeforeRecord);
            line = tail;
        }
        let how = if complete {
            Piece::Line
        } else {
            Piece::LastLine
        };
        self.add_piece(file, n, line, how);
    }

    fn add_piece(&mut self, file: &str, n: usize, piece: &[u8], how: Piece) {
        let text = std::str::from_utf8(piece);
        if how == Piece::BeforeRecord {
            // A whole record followed by another on one line is not something the guard
            // writes, but it is whole: keep it.
            if let Some(r) = text.ok().and_then(|t| parse_record(t).ok()) {
                return self.add_record(
                    r,
                    Origin {
                        file: file.to_string(),
                        line: n,
                    },
                );
            }
            if piece.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            return self.line_problem(
                file,
                n,
                "torn: a record cut short (its write ran out of space?), with a later record glued to it on the same line; the later record is kept".into(),
            );
        }
        let complete = how == Piece::Line;
        let Ok(text) = text else {
            self.line_problem(
                file,
                n,
                "not UTF-8 text (a binary file, or a corrupted write?)".into(),
            );
            return;
        };
        if text.trim().is_empty() {
            return;
        }
        match parse_line(text) {
            Ok(Line::Map(m)) => self.add_map(*m),
            Ok(Line::Record(r)) => self.add_record(*r, Origin { file: file.to_string(), line: n }),
            Err(e) if !complete && e.starts_with("partial record") => {
                self.line_problem(file, n, "torn: the file ends inside a record (no final newline); was the writer killed mid-write?".into())
            }
            Err(e) if !complete => self.line_problem(file, n, format!("torn (no final newline): {e}")),
            // A record's start cut short, then the newline its writer put before its next
            // record (`guard::output::sink`): torn.
            Err(e) if e.starts_with("partial record") && text.starts_with(RECORD_START) => {
                self.line_problem(file, n, "torn: a record cut short (its write ran out of space?); the records after it are kept".into())
            }
            Err(e) => self.line_problem(file, n, e),
        }
    }

    /// A GPU map record: the process's first one is kept.
    pub fn add_map(&mut self, m: MapRow) {
        if self.only_job.is_some() && m.job != self.only_job {
            return;
        }
        self.map_records += 1;
        let key = (m.host.clone(), m.pid);
        let keep = match self.maps.get(&key) {
            None => true,
            Some(old) => matches!((m.ts, old.ts), (Some(t), Some(o)) if t < o),
        };
        if keep && (self.maps.len() < MAPS_MAX || self.maps.contains_key(&key)) {
            self.maps.insert(key, m);
        }
    }

    pub fn add_record(&mut self, r: Row, at: Origin) {
        if self.only_job.is_some() && r.job != self.only_job {
            return;
        }
        let p = self.seen.entry((r.host.clone(), r.pid)).or_default();
        if p.rank.is_none() {
            p.rank = Some(rank_key(&r));
            p.gpu = r.sees.clone().or_else(|| r.gpu.clone());
            p.cvd = r.cvd.clone();
            p.mode = r.mode.clone();
            p.job = r.job.clone();
        }
        p.rules
            .entry(rule_key(&r.rule))
            .or_insert_with(|| (r.rule.clone(), 0))
            .1 += r.count as usize;
        self.seq += 1;
        let seq = self.seq;
        self.procs.insert((r.host.clone(), r.pid));
        self.ranks.insert(rank_key(&r));
        if r.summary {
            self.summaries += 1;
        }
        self.sites
            .entry((rule_key(&r.rule), r.call.clone(), r.site.clone()))
            .or_default()
            .add(&r, &at, seq);
        self.acc
            .entry((rule_key(&r.rule), r.call.clone(), rank_key(&r)))
            .or_default()
            .add(&r, &at, seq);
    }

    pub fn finish(mut self) -> Aggregate {
        self.end_file();
        let mut groups: Vec<Group> = Vec::new();
        let mut sites: BTreeMap<((u32, String), String), Vec<SiteStats>> = BTreeMap::new();
        for ((rk, call, site), a) in self.sites {
            let Some((first, first_at, _)) = a.first else {
                continue;
            };
            sites.entry((rk, call)).or_default().push(SiteStats {
                site,
                count: a.count,
                denied: a.denied,
                warned: a.warned,
                ranks: {
                    let mut v: Vec<Option<i64>> = Vec::new();
                    for k in &a.ranks {
                        let r = match k {
                            RankKey::Numbered(n) => Some(*n),
                            _ => None,
                        };
                        if !v.contains(&r) {
                            v.push(r);
                        }
                    }
                    v
                },
                rank_keys: a.ranks.iter().cloned().collect(),
                processes: a.procs.len(),
                first,
                first_at,
            });
        }
        for v in sites.values_mut() {
            v.sort_by(|a, b| {
                b.count
                    .cmp(&a.count)
                    .then((a.site.is_none(), &a.site).cmp(&(b.site.is_none(), &b.site)))
            });
        }
        let mut totals = Totals::default();
        for ((rk, call, _), a) in self.acc {
            let Some((first, first_at, _)) = a.first else {
                continue;
            };
            let rule = first.rule.clone();
            let same = groups
                .last()
                .is_some_and(|g| rule_key(&g.rule) == rk && g.call == call);
            if !same {
                let s = sites
                    .remove(&(rk.clone(), call.clone()))
                    .unwrap_or_default();
                groups.push(Group {
                    rule,
                    call,
                    count: 0,
                    denied: 0,
                    warned: 0,
                    ranks: Vec::new(),
                    sites: s,
                });
            }
            let g = groups.last_mut().expect("pushed above");
            g.count += a.count;
            g.denied += a.denied;
            g.warned += a.warned;
            totals.records += a.count;
            totals.denied += a.denied;
            totals.warned += a.warned;
            g.ranks.push(RankStats {
                rank: first.rank,
                rank_root: if first.rank.is_none() {
                    first.rank_root.clone()
                } else {
                    None
                },
                count: a.count,
                denied: a.denied,
                warned: a.warned,
                processes: a.procs.len(),
                first,
                first_at,
            });
        }
        totals.groups = groups.len();
        totals.ranks = self.ranks.len();
        totals.processes = self.procs.len();
        totals.problems = self.problem_count;
        totals.summaries = self.summaries;
        let map = map_of(self.maps, self.seen);
        Aggregate {
            groups,
            problems: self.problems,
            totals,
            unreadable: self.unreadable,
            unlisted: self.unlisted,
            map,
            map_records: self.map_records,
        }
    }
}

/// The GPU map: each process of a map record, with the rules its violations broke, and
/// each process known only from its violations (no map record: an older guard, or the
/// process was stopped before writing one).
fn map_of(
    maps: BTreeMap<(Option<String>, Option<i64>), MapRow>,
    mut seen: BTreeMap<(Option<String>, Option<i64>), ProcSeen>,
) -> Vec<MapProc> {
    let broke = |p: Option<&ProcSeen>| -> Vec<(String, usize)> {
        p.map(|p| p.rules.values().cloned().collect())
            .unwrap_or_default()
    };
    let mut out: Vec<MapProc> = Vec::new();
    for ((host, pid), m) in maps {
        let p = seen.remove(&(host.clone(), pid));
        let rank = match (m.rank, &m.rank_root) {
            (None, None) => p
                .as_ref()
                .and_then(|p| p.rank.clone())
                .unwrap_or(RankKey::Unknown),
            (r, root) => RankKey::of(r, root.as_ref()),
        };
        out.push(MapProc {
            rank: map_rank(rank),
            root_pid: m.rank_root.as_ref().map(|r| r.pid),
            gpu: m.gpu.clone(),
            index: m.index,
            cvd: m.cvd.clone(),
            mode: m.mode.clone(),
            job: m.job.clone(),
            mapped: true,
            broke: broke(p.as_ref()),
            host,
            pid,
        });
    }
    for ((host, pid), p) in seen {
        let rank = p.rank.clone().unwrap_or(RankKey::Unknown);
        out.push(MapProc {
            root_pid: match &rank {
                RankKey::Root(r) => Some(r.pid),
                _ => None,
            },
            rank: map_rank(rank),
            gpu: p.gpu.clone(),
            index: None,
            cvd: p.cvd.clone(),
            mode: p.mode.clone(),
            job: p.job.clone(),
            mapped: false,
            broke: broke(Some(&p)),
            host,
            pid,
        });
    }
    out.sort_by(|a, b| (&a.rank, &a.host, a.pid).cmp(&(&b.rank, &b.host, b.pid)));
    out
}

impl Aggregate {
    /// Exit status of `rankguard report` (docs/report.md): 1 when violations were found
    /// (whatever else happened), 2 when none were found but something could not be read
    /// (an unreadable file or an unusable line may have held one: fail closed), else 0.
    pub fn status(&self) -> u8 {
        if self.totals.records > 0 {
            1
        } else if self.totals.problems > 0 {
            2
        } else {
            0
        }
    }
}

// ---------------------------------------------------------------------------------------
// Time

/// `ts` (seconds since the epoch) as UTC `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
pub fn utc(ts: f64) -> String {
    let us = (ts * 1e6).round() as i64;
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:06}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Microseconds since the epoch, the integer form `--json` prints.
pub fn micros(ts: f64) -> i64 {
    (ts * 1e6).round() as i64
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // tuples spelled out so each test shows what it compares
mod tests {
    use super::*;
    use crate::json::{parse_json, Json};

    fn rec(ts: f64, call: &str, rule: &str, verdict: &str, rank: Option<i64>, pid: i64) -> String {
        let rank = rank.map_or("null".to_string(), |r| r.to_string());
        format!(
            r#"{{"ts":{ts},"call":"{call}","abi":"{call}","verdict":"{verdict}","rule":"{rule}","mode":"warn","pid":{pid},"tid":{pid},"host":"h","rank":{rank},"local_rank":null,"job":null,"ordinal":1,"cvd":"0,1","gpu":null,"rank_gpu":null,"args":"device=1","detail":"d{pid}"}}"#
        )
    }

    #[test]
    fn parses_json_values() {
        assert_eq!(
            parse_json(r#" {"a":[1,-2.5e1,true,null],"b":"x\"\u00e9\ud83d\ude00"} "#).unwrap(),
            Json::Obj(vec![
                (
                    "a".into(),
                    Json::Arr(vec![
                        Json::Num(1.0),
                        Json::Num(-25.0),
                        Json::Bool(true),
                        Json::Null
                    ])
                ),
                ("b".into(), Json::Str("x\"é😀".into())),
            ])
        );
        for bad in [
            "",
            "{",
            r#"{"a":1"#,
            r#"{"a":tru"#,
            "[1,]",
            "01x",
            r#"{"a":1}x"#,
            r#""\ud800""#,
            "\"a\u{1}\"",
            "-",
            "1.",
            "{1:2}",
        ] {
            assert!(parse_json(bad).is_err(), "{bad:?} parsed");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse_json(&deep).unwrap_err().contains("nested"));
    }

    #[test]
    fn a_record_needs_call_rule_verdict_and_typed_fields() {
        let r = parse_record(&rec(1.5, "cuDeviceGet", "R2", "deny", Some(3), 10)).unwrap();
        assert_eq!(
            (
                r.call.as_str(),
                r.rule.as_str(),
                r.verdict.as_str(),
                r.rank,
                r.pid
            ),
            ("cuDeviceGet", "R2", "deny", Some(3), Some(10))
        );
        assert_eq!(r.ordinal, Some(1));
        assert!(parse_record(r#"{"call":"x","verdict":"deny"}"#)
            .unwrap_err()
            .contains("'rule'"));
        assert!(
            parse_record(r#"{"call":"x","verdict":"deny","rule":"R2","pid":"7"}"#)
                .unwrap_err()
                .contains("'pid'")
        );
        assert!(parse_record("[1]").unwrap_err().contains("not an object"));
        // Unknown fields are ignored; missing optional ones are None.
        let r =
            parse_record(r#"{"call":"x","verdict":"warn","rule":"R9","handle":"mem","new":[1]}"#)
                .unwrap();
        assert_eq!(
            (r.rank, r.ts, r.rule.as_str(), r.exporter.is_none()),
            (None, None, "R9", true)
        );
        // R3's exporter fields.
        let r = parse_record(r#"{"call":"cuIpcOpenMemHandle","verdict":"deny","rule":"R3","exporter_pid":4,"exporter_rank":1,"exporter_job":null,"exporter_gpu":"GPU-1","exporter_location":"device"}"#).unwrap();
        assert_eq!(
            r.exporter,
            Some(ParsedExporter {
                pid: Some(4),
                rank: Some(1),
                job: None,
                gpu: Some("GPU-1".into()),
                location: Some("device".into()),
                rank_root: None
            })
        );
        let r = parse_record(
            r#"{"call":"c","verdict":"deny","rule":"R3","exporter_pid":null,"exporter_gpu":null}"#,
        )
        .unwrap();
        assert_eq!(r.exporter, Some(ParsedExporter::default()));
    }

    #[test]
    fn groups_by_rule_call_rank_with_counts_and_first_occurrence() {
        let mut a = Aggregator::new();
        let f1 = [
            rec(5.0, "cuDeviceGet", "R2", "deny", Some(1), 11),
            rec(3.0, "cuDeviceGet", "R2", "deny", Some(1), 12),
            rec(4.0, "cudaDeviceEnablePeerAccess", "R4", "warn", Some(0), 10),
            rec(1.0, "cuInit", "R1", "warn", None, 13),
        ]
        .join("\n")
            + "\n";
        let f2 = [
            rec(2.0, "cuDeviceGet", "R2", "warn", Some(0), 10),
            rec(9.0, "cuDeviceGet", "R2", "deny", Some(10), 14),
        ]
        .join("\n")
            + "\n";
        a.add_file("a", f1.as_bytes());
        a.add_file("b", f2.as_bytes());
        let s = a.finish();
        let shape: Vec<(String, String, Vec<(Option<i64>, usize, usize, usize, i64)>)> = s
            .groups
            .iter()
            .map(|g| {
                (
                    g.rule.clone(),
                    g.call.clone(),
                    g.ranks
                        .iter()
                        .map(|r| (r.rank, r.count, r.denied, r.warned, r.first.pid.unwrap()))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("R1".into(), "cuInit".into(), vec![(None, 1, 0, 1, 13)]),
                (
                    "R2".into(),
                    "cuDeviceGet".into(),
                    vec![
                        (Some(0), 1, 0, 1, 10),
                        (Some(1), 2, 2, 0, 12),
                        (Some(10), 1, 1, 0, 14)
                    ]
                ),
                (
                    "R4".into(),
                    "cudaDeviceEnablePeerAccess".into(),
                    vec![(Some(0), 1, 0, 1, 10)]
                ),
            ]
        );
        let r1 = &s.groups[1].ranks[1];
        assert_eq!(
            (r1.first_at.file.as_str(), r1.first_at.line, r1.processes),
            ("a", 2, 2)
        );
        assert_eq!(
            s.totals,
            Totals {
                records: 6,
                summaries: 0,
                denied: 3,
                warned: 3,
                groups: 3,
                ranks: 4,
                processes: 5,
                problems: 0
            }
        );
        assert_eq!(s.status(), 1);
    }

    #[test]
    fn ranks_without_a_number_are_grouped_by_rank_root() {
        let with_root = |ts: f64, pid: i64, root: Option<(i64, i64)>| {
            let root = root.map_or("null".to_string(), |(p, t)| {
                format!(r#"{{"pid":{p},"start":{t},"host":"h"}}"#)
            });
            rec(ts, "cuDeviceGet", "R2", "warn", None, pid).replace(
                r#""rank":null"#,
                &format!(r#""rank":null,"rank_root":{root}"#),
            )
        };
        let mut a = Aggregator::new();
        let lines = [
            with_root(1.0, 21, Some((20, 5))), // the root's tree: two processes
            with_root(2.0, 22, Some((20, 5))),
            with_root(3.0, 31, Some((20, 9))), // pid 20 reused: another root
            with_root(4.0, 40, None),
            rec(5.0, "cuDeviceGet", "R2", "warn", Some(2), 50),
        ]
        .join("\n");
        a.add_file("f", lines.as_bytes());
        let s = a.finish();
        let g = &s.groups[0];
        let got: Vec<_> = g
            .ranks
            .iter()
            .map(|r| {
                (
                    r.rank,
                    r.rank_root.as_ref().map(|x| (x.pid, x.start)),
                    r.count,
                    r.processes,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(2), None, 1, 1),
                (None, Some((20, 5)), 2, 2),
                (None, Some((20, 9)), 1, 1),
                (None, None, 1, 1)
            ]
        );
        assert_eq!(s.totals.ranks, 4);
        assert_eq!(g.ranks[1].rank_root.as_ref().unwrap().label(), "h:20");
        // a malformed root is a problem, not a crash
        let mut a = Aggregator::new();
        a.add_line(
            "f",
            1,
            br#"{"call":"x","verdict":"deny","rule":"R2","rank_root":{"pid":"1"}}"#,
            true,
        );
        a.add_line(
            "f",
            2,
            br#"{"call":"x","verdict":"deny","rule":"R2","rank_root":7}"#,
            true,
        );
        let s = a.finish();
        assert_eq!(s.problems.len(), 2);
        assert!(
            s.problems[0].why.contains("'rank_root'"),
            "{:?}",
            s.problems
        );
    }

    #[test]
    fn summaries_add_their_counts_and_sites_group_each_call() {
        let mut a = Aggregator::new();
        let full = |ts: f64, site: &str, pid: i64| {
            format!(
                r#"{{"ts":{ts},"call":"cuDeviceGet","verdict":"warn","rule":"R2","pid":{pid},"host":"h","rank":0,"args":"ordinal=1","site":"{site}","py_stack":["a.py:1 in <module>","{site}"]}}"#
            )
        };
        let summary = |ts: f64, site: &str, n: u64, pid: i64| {
            format!(
                r#"{{"ts":{ts},"summary":true,"count":{n},"since":1.0,"call":"cuDeviceGet","verdict":"warn","rule":"R2","pid":{pid},"host":"h","rank":0,"site":"{site}"}}"#
            )
        };
        // A summary read before any full record of its site is not its first occurrence.
        let lines = [
            summary(0.5, "a.py:7 in f", 199_900, 1),
            full(1.0, "a.py:7 in f", 1),
            full(2.0, "a.py:9 in g", 1),
            summary(3.0, "a.py:7 in f", 50, 2),
            r#"{"ts":4.0,"call":"cuDeviceGet","verdict":"deny","rule":"R2","pid":3,"host":"h","rank":1}"#.to_string(),
        ];
        for (i, l) in lines.iter().enumerate() {
            a.add_line("f", i + 1, l.as_bytes(), true);
        }
        let s = a.finish();
        assert_eq!(
            (
                s.totals.records,
                s.totals.summaries,
                s.totals.warned,
                s.totals.denied
            ),
            (199_953, 2, 199_952, 1)
        );
        let g = &s.groups[0];
        assert_eq!(g.count, 199_953);
        let sites: Vec<(Option<&str>, usize, usize, Vec<Option<i64>>)> = g
            .sites
            .iter()
            .map(|x| (x.site.as_deref(), x.count, x.processes, x.ranks.clone()))
            .collect();
        assert_eq!(
            sites,
            vec![
                (Some("a.py:7 in f"), 199_951, 2, vec![Some(0)]),
                (Some("a.py:9 in g"), 1, 1, vec![Some(0)]),
                (None, 1, 1, vec![Some(1)]),
            ]
        );
        assert!(!g.sites[0].first.summary && g.sites[0].first_at.line == 2);
        assert_eq!(
            g.sites[0].first.py_stack,
            ["a.py:1 in <module>", "a.py:7 in f"]
        );
        assert_eq!(g.ranks[0].count, 199_952);
        assert!(!g.ranks[0].first.summary);
    }

    #[test]
    fn a_summary_needs_a_positive_count() {
        for bad in [
            r#"{"summary":true,"call":"c","verdict":"warn","rule":"R2"}"#,
            r#"{"summary":true,"count":0,"call":"c","verdict":"warn","rule":"R2"}"#,
            r#"{"summary":1,"count":3,"call":"c","verdict":"warn","rule":"R2"}"#,
        ] {
            assert!(parse_record(bad).is_err(), "{bad}");
        }
        // A count on a record that is not a summary is not a multiplier.
        assert_eq!(
            parse_record(r#"{"count":9,"call":"c","verdict":"warn","rule":"R2"}"#)
                .unwrap()
                .count,
            1
        );
        assert!(
            parse_record(r#"{"call":"c","verdict":"warn","rule":"R2","py_stack":[1]}"#).is_err()
        );
    }

    #[test]
    fn equal_or_missing_times_keep_input_order() {
        let mut a = Aggregator::new();
        a.add_line(
            "f",
            1,
            rec(1.0, "c", "R2", "deny", Some(0), 1).as_bytes(),
            true,
        );
        a.add_line(
            "f",
            2,
            rec(1.0, "c", "R2", "deny", Some(0), 2).as_bytes(),
            true,
        );
        a.add_line(
            "f",
            3,
            br#"{"call":"c","verdict":"deny","rule":"R2","rank":0,"pid":3}"#,
            true,
        );
        let s = a.finish();
        assert_eq!(s.groups[0].ranks[0].first.pid, Some(1));
    }

    /// A map record is kept for `report --map`: neither a violation nor a problem, so a
    /// clean job's audit (map records only) reports status 0.
    #[test]
    fn map_records_are_kept_apart_from_violations() {
        let map = r#"{"format":"rankguard-audit","version":1,"kind":"map","ts":1.5,"host":"h","pid":7,"start":70,"rank":0,"local_rank":0,"job":null,"rank_root":null,"mode":"enforce","cvd":"3","cvd_start":"3","devices":1,"gpu":"GPU-3","rank_gpu":null,"rank_gpu_uuid":null,"r1":"ok"}"#;
        let mut a = Aggregator::new();
        a.add_file("m.jsonl", format!("{map}\n").as_bytes());
        let s = a.finish();
        assert_eq!((s.status(), s.totals.records, s.totals.problems), (0, 0, 0));
        assert_eq!((s.map_records, s.map.len()), (1, 1));
        let m = &s.map[0];
        assert_eq!(
            (m.pid, m.gpu.as_deref(), m.mapped),
            (Some(7), Some("GPU-3"), true)
        );
        // with a violation beside it, only the violation counts
        let mut a = Aggregator::new();
        let v = rec(2.0, "cuDeviceGet", "R2", "deny", Some(0), 7);
        a.add_file("m.jsonl", format!("{map}\n{v}\n").as_bytes());
        let s = a.finish();
        assert_eq!((s.totals.records, s.map_records, s.status()), (1, 1, 1));
    }

    #[test]
    fn bad_lines_are_problems_not_errors() {
        let mut a = Aggregator::new();
        let good = rec(1.0, "c", "R2", "deny", Some(0), 1);
        let text = format!(
            "{good}\n\n{}\nhello\n\u{0}\u{ff}\n{{\"call\":1}}\n{}",
            &good[..40],
            &good[..30]
        );
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(b"");
        a.add_file("f", &bytes);
        a.add_line("g", 1, b"\xff\xfe", true);
        a.unreadable("missing", "cannot read: No such file or directory".into());
        let s = a.finish();
        assert_eq!(s.totals.records, 1);
        let lines: Vec<(String, Option<usize>)> = s
            .problems
            .iter()
            .map(|p| (p.file.clone(), p.line))
            .collect();
        assert_eq!(
            lines,
            vec![
                ("f".into(), Some(3)),
                ("f".into(), Some(4)),
                ("f".into(), Some(5)),
                ("f".into(), Some(6)),
                ("f".into(), Some(7)),
                ("g".into(), Some(1)),
                ("missing".into(), None),
            ]
        );
        assert!(
            s.problems[0].why.starts_with("partial record"),
            "{}",
            s.problems[0].why
        );
        assert!(
            s.problems[1].why.starts_with("not JSON: unexpected 'h'"),
            "{}",
            s.problems[1].why
        );
        assert!(
            s.problems[3]
                .why
                .starts_with("not an audit record: field 'call'"),
            "{}",
            s.problems[3].why
        );
        assert!(
            s.problems[4].why.starts_with("torn"),
            "{}",
            s.problems[4].why
        );
        assert!(s.problems[5].why.contains("UTF-8"));
        assert_eq!(s.unreadable, 1);
        assert_eq!(s.status(), 1);
    }

    #[test]
    fn problems_are_all_counted_and_a_bounded_sample_listed() {
        let mut a = Aggregator::new();
        for n in 1..=1000 {
            a.add_line("core", n, b"\xff", true);
        }
        a.add_line("core", 1001, &[b'x'; 2 * WHY_MAX], true);
        a.unreadable("gone", "cannot read".into());
        let s = a.finish();
        assert_eq!((s.totals.problems, s.unlisted, s.unreadable), (1002, 0, 1));
        assert_eq!(s.problems.len(), LISTED_PER_FILE + 2);
        assert_eq!(s.problems[0].line, Some(1));
        assert_eq!(
            s.problems[LISTED_PER_FILE],
            Problem {
                file: "core".into(),
                line: Some(11),
                why:
                    "991 more unusable lines not listed (lines 11 to 1001; the first 10 are listed)"
                        .into()
            }
        );
        assert_eq!(s.problems[LISTED_PER_FILE + 1].file, "gone");

        // Many files: the list stops at LISTED_MAX entries, the rest only counted.
        let mut a = Aggregator::new();
        for f in 0..50 {
            for n in 1..=20 {
                a.add_line(&format!("f{f}"), n, b"{", true);
            }
        }
        let s = a.finish();
        assert_eq!(s.problems.len(), LISTED_MAX);
        assert_eq!(s.totals.problems, 1000);
        // 9 files listed in full (10 samples + a count of 10 each: 99 entries), then the
        // 10th file's first line; every other problem is counted as unlisted.
        assert_eq!(s.unlisted, 1000 - 9 * 20 - 1);
        assert_eq!(s.status(), 2);

        // A long reason is cut, at a character boundary.
        let mut a = Aggregator::new();
        a.line_problem("f", 1, "é".repeat(WHY_MAX));
        let why = &a.finish().problems[0].why;
        assert!(why.len() <= WHY_MAX + 3 && why.ends_with("é..."), "{why}");
    }

    #[test]
    fn status_fails_closed_when_nothing_found_but_something_unreadable() {
        assert_eq!(Aggregator::new().finish().status(), 0);
        let mut a = Aggregator::new();
        a.add_line("f", 1, b"{", true);
        assert_eq!(a.finish().status(), 2);
    }

    #[test]
    fn rule_order_is_numeric() {
        let mut a = Aggregator::new();
        for (i, rule) in ["R10", "Rx", "R2", "R1"].iter().enumerate() {
            a.add_line(
                "f",
                i + 1,
                rec(1.0, "c", rule, "warn", Some(0), 1).as_bytes(),
                true,
            );
        }
        let rules: Vec<String> = a.finish().groups.into_iter().map(|g| g.rule).collect();
        assert_eq!(rules, ["R1", "R2", "R10", "Rx"]);
    }

    #[test]
    fn utc_formats_epoch_seconds() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc(951_782_400.25), "2000-02-29T00:00:00.250000Z");
        assert_eq!(utc(1_796_046_555.123456), "2026-11-30T13:49:15.123456Z");
        assert_eq!(micros(1.5), 1_500_000);
    }

    #[test]
    fn a_fragment_glued_to_a_later_record_is_one_torn_record_and_the_later_one_is_kept() {
        // Issue 29, item 7: a write cut short by a full file system leaves a fragment with
        // no newline; the next record (written after space was freed) is glued to it.
        let full = |ts: f64, pid: i64| {
            rec(ts, "cuDeviceGet", "R2", "warn", Some(0), pid).replacen(
                '{',
                &format!("{RECORD_START},\"version\":1,"),
                1,
            )
        };
        let whole: Vec<String> = (1..=7).map(|i| full(f64::from(i), i.into())).collect();
        let torn = full(8.0, 8);
        let fragment = &torn[..torn.len() / 2];
        let later = [full(9.0, 9), full(10.0, 10)];
        // The fragment alone on its line (the writer's resynchronising newline), glued to a
        // later record (another process's), and glued twice.
        for text in [
            format!(
                "{}\n{fragment}\n{}\n{}\n",
                whole.join("\n"),
                later[0],
                later[1]
            ),
            format!(
                "{}\n{fragment}{}\n{}\n",
                whole.join("\n"),
                later[0],
                later[1]
            ),
            format!(
                "{}\n{fragment}{fragment}{}\n{}\n",
                whole.join("\n"),
                later[0],
                later[1]
            ),
        ] {
            let mut a = Aggregator::new();
            a.add_file("f", text.as_bytes());
            let s = a.finish();
            assert_eq!(s.totals.records, 9, "{text}");
            let torn_ones = if text.contains(&format!("{fragment}{fragment}")) {
                2
            } else {
                1
            };
            assert_eq!(s.totals.problems, torn_ones, "{:?}", s.problems);
            assert!(s
                .problems
                .iter()
                .all(|p| p.why.starts_with("torn") && p.line == Some(8)));
        }
        // A cut that lands inside a multi-byte character is torn too, not "not UTF-8".
        let mut a = Aggregator::new();
        let mut bytes = "{\"format\":\"rankguard-audit\",\"site\":\"é"
            .as_bytes()
            .to_vec();
        bytes.pop();
        bytes.extend_from_slice(later[0].as_bytes());
        a.add_file("f", &bytes);
        let s = a.finish();
        assert_eq!((s.totals.records, s.totals.problems), (1, 1));
        assert!(s.problems[0].why.starts_with("torn"), "{:?}", s.problems);
    }
}
