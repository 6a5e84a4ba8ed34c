//! `rankguard report AUDIT... [--json]`: what the guard recorded across a job, for a person
//! debugging a legacy config. Reads the audit files (`RANKGUARD_AUDIT`, one or many: all
//! ranks of a job) and prints the violations grouped by rule and call, then by call site and per rank, with counts
//! and the first occurrence; unusable files and lines are listed, never fatal.
//!
//! The aggregation is `crate::audit` (pure, unit-tested); this file reads files and renders.
//! Formats and exit statuses are documented in docs/report.md.

use std::ffi::OsString;
use std::fmt::Write;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::args::{Lexer, Token};
use super::exit::{emit, Error, ExitCode, Result};
use super::json_out::Value;
use crate::audit::{self, Aggregate, Aggregator, Group, RankKey, RankStats, SiteStats};

const HELP: &str = "\
Usage: rankguard report [--json] [--map] AUDIT...

Summarise RANKGUARD_AUDIT files (JSON lines written by librankguard.so; give all ranks'
files of a job, a directory holding them, or - for standard input): violations grouped by
rule and call, then by call site (where in the program: FILE:LINE in FUNCTION or
OBJECT(SYMBOL+0xOFF)). A site broken identically in many ranks is one entry with its rank
list (ranks 0-7), its counts and its first occurrence (time, host:pid, call and arguments,
why; for R1 the GPU the process saw and the rank's). A rank with no number is named by its
rank root, root host:pid; - names records with neither.
Summary records (counts of a site's violations after its first 100) add into the counts.
Unreadable files and torn or non-JSON lines are problems, skipped and all counted; the
first 10 of each file are listed, the rest counted per file (100 entries in all). A
directory is walked recursively (regular files, not through symbolic links to directories);
FIFOs, sockets and devices inside it are listed as not read. Lines longer than 64 KiB are
skipped and counted.

  --map     the GPU map instead: rank -> processes -> the GPU each saw (from the map
            record the guard writes at each process's first cuInit), with the rules each
            process broke
  --json    a stable JSON document instead of text (with --map: and its \"map\" list)

Exit 0: no violations and everything was read; 1: violations found; 2: usage error, or
no violations found but some file or line could not be read.
";

/// The `--json` format's version: bumped on any incompatible change (docs/report.md).
/// 2: `format` added; times are `ts`, Unix seconds as in the audit record (was `time`,
/// an RFC 3339 string, and `ts_us`).
const JSON_VERSION: i64 = 2;

pub fn main(args: Vec<OsString>) -> Result<ExitCode> {
    let mut lx = Lexer::new("report", args);
    let mut json = false;
    let mut map = false;
    let mut files: Vec<OsString> = Vec::new();
    let mut only_files = false;
    while let Some(t) = lx.next()? {
        match t {
            Token::Flag(f) if !only_files => match f.as_str() {
                "-h" | "--help" => {
                    emit(HELP);
                    return Ok(ExitCode::SUCCESS);
                }
                "--json" => json = true,
                "--map" => map = true,
                _ => return Err(lx.unknown(&f)),
            },
            Token::Flag(f) => files.push(f.into()),
            Token::Word(w) => files.push(w),
            Token::End if !only_files => only_files = true,
            Token::End => files.push("--".into()),
        }
    }
    if files.is_empty() {
        return Err(Error::usage(
            "rankguard report: name at least one audit file, e.g. rankguard report /tmp/audit.*.jsonl \
             (the files RANKGUARD_AUDIT pointed the ranks at)",
        ));
    }
    let mut agg = Aggregator::new();
    let mut read: Vec<String> = Vec::new();
    for f in &files {
        if f == "-" {
            let name = "<stdin>".to_string();
            match feed_from(std::io::stdin().lock(), &name, &mut agg) {
                Ok(()) => read.push(name),
                Err(e) => agg.unreadable(&name, format!("cannot read: {e}")),
            }
            continue;
        }
        for p in expand(Path::new(f), &mut agg) {
            let name = p.display().to_string();
            match feed(&p, &name, &mut agg) {
                Ok(()) => read.push(name),
                Err(e) => agg.unreadable(&name, format!("cannot read: {e}")),
            }
        }
    }
    let summary = agg.finish();
    if json {
        let mut doc = json_doc(&summary, &read);
        if map {
            if let Value::Obj(fields) = &mut doc {
                // Before "status", which stays last.
                let at = fields.len() - 1;
                fields.insert(at, ("map", map_json(&summary)));
            }
        }
        emit(&doc.pretty());
    } else if map {
        emit(&map_text(&summary, read.len()));
    } else {
        emit(&text(&summary, read.len()));
    }
    Ok(ExitCode::from(summary.status()))
}

/// Every audit file under `paths` (files, or directories walked as `report` walks them),
/// read into `agg`; unreadable ones become its problems. Returns the files read.
pub(super) fn read_into(paths: &[PathBuf], agg: &mut Aggregator) -> Vec<String> {
    let mut read = Vec::new();
    for f in paths {
        for p in expand(f, agg) {
            let name = p.display().to_string();
            match feed(&p, &name, agg) {
                Ok(()) => read.push(name),
                Err(e) => agg.unreadable(&name, format!("cannot read: {e}")),
            }
        }
    }
    read
}

/// One named input: a file (read whatever it is: `<(...)`, `/dev/stdin`), or a directory
/// walked by a fixed rule (docs/report.md): its regular files at any depth, in path order;
/// subdirectories are entered, but not through a symbolic link (it could loop) nor deeper
/// than [`MAX_DEPTH`]; anything else inside (FIFO, socket, device: opening a FIFO can block
/// forever) is listed as not read. Whatever was not read is a problem, never silence.
fn expand(p: &Path, agg: &mut Aggregator) -> Vec<PathBuf> {
    if !p.is_dir() {
        return vec![p.to_path_buf()];
    }
    let mut out = Vec::new();
    walk(p, 0, agg, &mut out);
    if out.is_empty() {
        agg.unreadable(
            &p.display().to_string(),
            "a directory with no files in it; name the audit files".into(),
        );
    }
    out
}

/// How deep a directory argument is walked.
const MAX_DEPTH: usize = 16;

fn walk(dir: &Path, depth: usize, agg: &mut Aggregator, out: &mut Vec<PathBuf>) {
    let name = dir.display().to_string();
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            agg.unreadable(&name, format!("cannot list the directory: {e}"));
            return;
        }
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for e in entries {
        match e {
            Ok(e) => paths.push(e.path()),
            Err(e) => agg.unreadable(&name, format!("cannot list the directory entirely: {e}")),
        }
    }
    paths.sort();
    for path in paths {
        let shown = path.display().to_string();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            agg.unreadable(&shown, "vanished or cannot be examined; not read".into());
            continue;
        };
        let ft = md.file_type();
        if ft.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                agg.unreadable(
                    &shown,
                    format!("a directory deeper than {MAX_DEPTH} levels; not read (name it)"),
                );
            } else {
                walk(&path, depth + 1, agg, out);
            }
        } else if ft.is_file() {
            out.push(path);
        } else if ft.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(t) if t.is_file() => out.push(path),
                Ok(t) if t.is_dir() => agg.unreadable(
                    &shown,
                    "a symbolic link to a directory; not followed (it could loop), name the directory itself".into(),
                ),
                Ok(_) => agg.unreadable(&shown, "a symbolic link to something that is not a regular file; not read".into()),
                Err(e) => agg.unreadable(&shown, format!("a broken symbolic link ({e}); not read")),
            }
        } else {
            agg.unreadable(
                &shown,
                "not a regular file (a FIFO, socket or device); not read inside a directory (name it to read it)".into(),
            );
        }
    }
}

/// Stream one file's lines into the aggregator (audit files of a legacy job in warn mode
/// can be large: never hold a whole file). An error part-way keeps the lines already read.
fn feed(p: &Path, name: &str, agg: &mut Aggregator) -> std::io::Result<()> {
    feed_from(BufReader::new(File::open(p)?), name, agg)
}

/// The longest line kept: far beyond any record the guard writes (4 KiB), so that a longer
/// one is not a record. Longer lines are skipped (and counted) without being held: memory
/// stays bounded whatever the input (`/dev/zero`, a 200 MB line).
pub const MAX_LINE: usize = 64 * 1024;

fn feed_from(mut r: impl BufRead, name: &str, agg: &mut Aggregator) -> std::io::Result<()> {
    let mut line: Vec<u8> = Vec::new();
    let mut n = 0;
    let mut too_long = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            // End of input: a last line without a newline.
            if too_long {
                n += 1;
                skipped(agg, name, n);
            } else if !line.is_empty() {
                n += 1;
                agg.add_line(name, n, &line, false);
            }
            return Ok(());
        }
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE {
                too_long = true;
                line.clear();
                line.shrink_to(MAX_LINE);
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = chunk.len() + usize::from(newline);
        r.consume(used);
        if newline {
            n += 1;
            if too_long {
                skipped(agg, name, n);
            } else {
                agg.add_line(name, n, &line, true);
            }
            line.clear();
            too_long = false;
        }
    }
}

/// Line `n`, too long to be a record, was skipped unread: a problem like any other.
fn skipped(agg: &mut Aggregator, name: &str, n: usize) {
    agg.line_problem(
        name,
        n,
        format!(
            "line longer than {} KiB skipped (no audit record is that long: not an audit file?)",
            MAX_LINE / 1024
        ),
    );
}

fn counts(count: usize, denied: usize, warned: usize) -> String {
    match (denied, warned) {
        (_, 0) => format!("{count} denied"),
        (0, _) => format!("{count} warned"),
        _ => format!("{count} ({denied} denied, {warned} warned)"),
    }
}

/// `N`, `root host:pid` (a rank with no number, named by its root) or `-`: the one way
/// the report names a rank (`audit::RankKey::label`).
fn rank_name(r: Option<i64>, root: Option<&audit::ParsedRoot>) -> String {
    RankKey::of(r, root).label()
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The human report.
fn text(s: &Aggregate, files: usize) -> String {
    let mut o = String::new();
    let mut rule = "";
    for g in &s.groups {
        if g.rule != rule {
            rule = &g.rule;
            let _ = writeln!(o, "{} {}", g.rule, audit::rule_name(&g.rule));
        }
        group_text(&mut o, g);
    }
    tail_text(&mut o, s, files);
    o
}

/// The problems (if any) and the total line, after whatever `o` holds.
fn tail_text(o: &mut String, s: &Aggregate, files: usize) {
    let t = &s.totals;
    if !s.problems.is_empty() {
        if !o.is_empty() {
            o.push('\n');
        }
        let _ = writeln!(o, "problems (skipped, not counted above):");
        for p in &s.problems {
            match p.line {
                Some(n) => {
                    let _ = writeln!(o, "  {}:{n}: {}", p.file, p.why);
                }
                None => {
                    let _ = writeln!(o, "  {}: {}", p.file, p.why);
                }
            }
        }
        if s.unlisted > 0 {
            let _ = writeln!(
                o,
                "  ... and {} not listed (the list holds {} entries)",
                plural(s.unlisted, "more problem", "more problems"),
                audit::LISTED_MAX
            );
        }
    }
    if !o.is_empty() {
        o.push('\n');
    }
    if t.records == 0 {
        let _ = write!(
            o,
            "total: no violations in {}",
            plural(files, "file", "files")
        );
    } else {
        let _ = write!(
            o,
            "total: {} ({} denied, {} warned) of {} under {}, in {}, {}, from {}",
            plural(t.records, "violation", "violations"),
            t.denied,
            t.warned,
            plural(t.groups, "call", "calls"),
            plural(
                s.groups
                    .iter()
                    .map(|g| &g.rule)
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                "rule",
                "rules"
            ),
            plural(t.ranks, "rank", "ranks"),
            plural(t.processes, "process", "processes"),
            plural(files, "file", "files"),
        );
    }
    if t.problems > 0 {
        let _ = write!(o, "; {} skipped", plural(t.problems, "problem", "problems"));
        if s.unreadable > 0 {
            let _ = write!(o, " ({} unreadable)", plural(s.unreadable, "file", "files"));
        }
    }
    o.push('\n');
}

fn group_text(o: &mut String, g: &Group) {
    let ranks: Vec<RankKey> = g
        .ranks
        .iter()
        .map(|r| RankKey::of(r.rank, r.rank_root.as_ref()))
        .collect();
    let _ = writeln!(
        o,
        "  {}: {} in {}",
        g.call,
        counts(g.count, g.denied, g.warned),
        audit::rank_list(&ranks)
    );
    for s in &g.sites {
        site_text(o, g, s);
    }
}

/// One site, folded across ranks: `    at legacy_cfg.py:7 in place_learner: 8 denied in
/// ranks 0-7, from 8 processes`, then its first occurrence: when, where, the verdict and
/// why, and what the process saw (R1: its GPU and the rank's).
fn site_text(o: &mut String, g: &Group, s: &SiteStats) {
    let _ = writeln!(
        o,
        "    at {}: {} in {}, from {}",
        s.site.as_deref().unwrap_or("<site not recorded>"),
        counts(s.count, s.denied, s.warned),
        audit::rank_list(&s.rank_keys),
        plural(s.processes, "process", "processes")
    );
    let f = &s.first;
    let _ = writeln!(
        o,
        "      first {} {}:{} {}({}) {}: {}",
        f.ts.map_or_else(|| "time unknown".to_string(), audit::utc),
        f.host.as_deref().unwrap_or("?"),
        f.pid.map_or("?".to_string(), |p| p.to_string()),
        g.call,
        f.args.as_deref().unwrap_or(""),
        if f.verdict == "deny" {
            "denied"
        } else {
            "allowed (warn mode)"
        },
        f.detail
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or("no detail recorded"),
    );
    let cvd = cvd_text(f.cvd.as_deref());
    let job = f
        .job
        .as_deref()
        .map(|j| format!(", job {j}"))
        .unwrap_or_default();
    let at = format!("({}:{})", s.first_at.file, s.first_at.line);
    if g.rule == "R1" {
        let _ = writeln!(
            o,
            "      saw {} (CUDA_VISIBLE_DEVICES={cvd}); the rank's GPU: {}{job} {at}",
            seen_gpu(f),
            rank_gpu_text(f)
        );
    } else {
        let _ = writeln!(
            o,
            "      CUDA_VISIBLE_DEVICES={cvd}, GPU {}{job} {at}",
            f.gpu.as_deref().unwrap_or("unknown"),
        );
    }
    if let Some(x) = &f.exporter {
        match x.pid {
            Some(pid) => {
                let _ = writeln!(
                    o,
                    "      exported by pid {pid} (rank {}) on {}{}",
                    rank_name(x.rank, x.rank_root.as_ref()),
                    x.gpu.as_deref().unwrap_or("an unknown GPU"),
                    x.location
                        .as_deref()
                        .map(|l| format!(" ({l} memory)"))
                        .unwrap_or_default()
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "      exporter unknown (no trusted provenance record for the handle)"
                );
            }
        }
    }
}

fn cvd_text(cvd: Option<&str>) -> &str {
    match cvd {
        None => "<unset>",
        Some("") => "<empty>",
        Some(c) => c,
    }
}

/// What an R1 process saw: the one GPU (its UUID), or how many devices.
fn seen_gpu(f: &audit::Row) -> String {
    match (f.sees.as_deref().or(f.gpu.as_deref()), f.devices) {
        (Some(g), _) => g.to_string(),
        (None, Some(n)) if n != 1 => plural(n.max(0) as usize, "device", "devices"),
        _ => "no identifiable GPU".to_string(),
    }
}

/// The rank's GPU as an R1 record names it: the entry the launcher gave and its UUID.
fn rank_gpu_text(f: &audit::Row) -> String {
    match (f.rank_gpu.as_deref(), f.rank_gpu_uuid.as_deref()) {
        (Some(e), Some(u)) if e != u => format!("{u} (entry {e})"),
        (Some(e), _) => e.to_string(),
        (None, Some(u)) => u.to_string(),
        (None, None) => "none named (no RANKGUARD_RANK_GPU, no rank root with one GPU)".into(),
    }
}

/// The GPU map as a table (`report --map`): per rank its processes, each with the GPU it
/// saw, and the rules it broke; a rank's number or root is printed on its first row.
fn map_text(s: &Aggregate, files: usize) -> String {
    let mut o = String::new();
    if s.map.is_empty() {
        let _ = writeln!(
            o,
            "GPU map: no map record and no violation in {} (the guard writes a map record at each \
             process's first cuInit to RANKGUARD_AUDIT)",
            plural(files, "file", "files")
        );
    } else {
        let ranks: std::collections::BTreeSet<&RankKey> = s.map.iter().map(|p| &p.rank).collect();
        let _ = writeln!(
            o,
            "GPU map: {}, {} ({} read)",
            plural(ranks.len(), "rank", "ranks"),
            plural(s.map.len(), "process", "processes"),
            plural(s.map_records, "map record", "map records")
        );
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
        let mut rows: Vec<Vec<String>> = vec![[
            "RANK", "HOST", "PID", "ROOT", "GPU", "INDEX", "CVD", "MODE", "BROKE",
        ]
        .map(String::from)
        .to_vec()];
        let mut last: Option<&RankKey> = None;
        for p in &s.map {
            let rank = if last == Some(&p.rank) {
                String::new()
            } else {
                p.rank.label()
            };
            last = Some(&p.rank);
            let broke = if p.broke.is_empty() {
                "-".to_string()
            } else {
                p.broke
                    .iter()
                    .map(|(r, n)| format!("{r} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            rows.push(vec![
                rank,
                dash(p.host.clone()),
                dash(p.pid.map(|n| n.to_string())),
                dash(p.root_pid.map(|n| n.to_string())),
                format!(
                    "{}{}",
                    p.gpu.as_deref().unwrap_or("unknown"),
                    if p.mapped { "" } else { " *" }
                ),
                dash(p.index.map(|n| n.to_string())),
                // A map record without `cvd` says nothing about it: `-`, not `<unset>`.
                match p.cvd.as_deref() {
                    None => "-".to_string(),
                    Some("") => "<empty>".to_string(),
                    Some(c) => c.to_string(),
                },
                dash(p.mode.clone()),
                broke,
            ]);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for row in rows {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(v, w)| format!("{v:<w$}"))
                .collect();
            let _ = writeln!(o, "{}", line.join("  ").trim_end());
        }
        if s.map.iter().any(|p| !p.mapped) {
            let _ = writeln!(
                o,
                "* no map record for this process: its GPU is its first violation's (a guard \
                 without map records, or a process stopped before writing one)"
            );
        }
    }
    // The problems and the total line, as the report prints them.
    tail_text(&mut o, s, files);
    o
}

fn map_json(s: &Aggregate) -> Value {
    Value::Arr(
        s.map
            .iter()
            .map(|p| {
                Value::Obj(vec![
                    (
                        "rank",
                        match &p.rank {
                            RankKey::Numbered(n) => Value::Num(*n),
                            _ => Value::Null,
                        },
                    ),
                    ("rank_name", Value::str(p.rank.label())),
                    ("host", Value::opt_str(p.host.clone())),
                    ("pid", Value::opt_num(p.pid)),
                    ("root_pid", Value::opt_num(p.root_pid)),
                    ("gpu", Value::opt_str(p.gpu.clone())),
                    ("index", Value::opt_num(p.index)),
                    ("cvd", Value::opt_str(p.cvd.clone())),
                    ("mode", Value::opt_str(p.mode.clone())),
                    ("job", Value::opt_str(p.job.clone())),
                    ("mapped", Value::Bool(p.mapped)),
                    (
                        "broke",
                        Value::Arr(
                            p.broke
                                .iter()
                                .map(|(r, n)| {
                                    Value::Obj(vec![
                                        ("rule", Value::str(r)),
                                        ("count", Value::Num(*n as i64)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                ])
            })
            .collect(),
    )
}

/// The `--json` document (docs/report.md; field order is part of the format).
fn json_doc(s: &Aggregate, files: &[String]) -> Value {
    let t = &s.totals;
    let groups = s
        .groups
        .iter()
        .map(|g| {
            Value::Obj(vec![
                ("rule", Value::str(&g.rule)),
                ("rule_name", Value::str(audit::rule_name(&g.rule))),
                ("call", Value::str(&g.call)),
                ("count", Value::Num(g.count as i64)),
                ("denied", Value::Num(g.denied as i64)),
                ("warned", Value::Num(g.warned as i64)),
                ("ranks", Value::Arr(g.ranks.iter().map(rank_json).collect())),
                ("sites", Value::Arr(g.sites.iter().map(site_json).collect())),
            ])
        })
        .collect();
    let problems = s
        .problems
        .iter()
        .map(|p| {
            Value::Obj(vec![
                ("file", Value::str(&p.file)),
                ("line", Value::opt_num(p.line.map(|n| n as i64))),
                ("why", Value::str(&p.why)),
            ])
        })
        .collect();
    Value::Obj(vec![
        ("format", Value::str("rankguard-report")),
        ("version", Value::Num(JSON_VERSION)),
        ("files", Value::Arr(files.iter().map(Value::str).collect())),
        (
            "totals",
            Value::Obj(vec![
                ("violations", Value::Num(t.records as i64)),
                ("summary_records", Value::Num(t.summaries as i64)),
                ("denied", Value::Num(t.denied as i64)),
                ("warned", Value::Num(t.warned as i64)),
                ("calls", Value::Num(t.groups as i64)),
                ("ranks", Value::Num(t.ranks as i64)),
                ("processes", Value::Num(t.processes as i64)),
                ("problems", Value::Num(t.problems as i64)),
                ("problems_unlisted", Value::Num(s.unlisted as i64)),
            ]),
        ),
        ("groups", Value::Arr(groups)),
        ("problems", Value::Arr(problems)),
        ("status", Value::Num(i64::from(s.status()))),
    ])
}

fn root_json(root: Option<&audit::ParsedRoot>) -> Value {
    root.map_or(Value::Null, |x| {
        Value::Obj(vec![
            ("pid", Value::Num(x.pid)),
            ("start", Value::Num(x.start)),
            ("host", Value::opt_str(x.host.clone())),
        ])
    })
}

fn site_json(s: &SiteStats) -> Value {
    let f = &s.first;
    Value::Obj(vec![
        ("site", Value::opt_str(s.site.clone())),
        ("count", Value::Num(s.count as i64)),
        ("denied", Value::Num(s.denied as i64)),
        ("warned", Value::Num(s.warned as i64)),
        (
            "ranks",
            Value::Arr(s.ranks.iter().map(|&r| Value::opt_num(r)).collect()),
        ),
        (
            "rank_roots",
            Value::Arr(
                s.rank_keys
                    .iter()
                    .filter_map(|k| match k {
                        RankKey::Root(r) => Some(root_json(Some(r))),
                        _ => None,
                    })
                    .collect(),
            ),
        ),
        (
            "rank_names",
            Value::Arr(s.rank_keys.iter().map(|k| Value::str(k.label())).collect()),
        ),
        ("processes", Value::Num(s.processes as i64)),
        (
            "first",
            Value::Obj(vec![
                ("ts", Value::opt_secs(f.ts.map(audit::micros))),
                ("host", Value::opt_str(f.host.clone())),
                ("pid", Value::opt_num(f.pid)),
                ("rank", Value::opt_num(f.rank)),
                ("args", Value::opt_str(f.args.clone())),
                ("verdict", Value::str(&f.verdict)),
                ("detail", Value::opt_str(f.detail.clone())),
                ("cvd", Value::opt_str(f.cvd.clone())),
                ("gpu", Value::opt_str(f.gpu.clone())),
                ("sees", Value::opt_str(f.sees.clone())),
                ("devices", Value::opt_num(f.devices)),
                ("rank_gpu", Value::opt_str(f.rank_gpu.clone())),
                ("rank_gpu_uuid", Value::opt_str(f.rank_gpu_uuid.clone())),
                (
                    "py_stack",
                    Value::Arr(f.py_stack.iter().map(Value::str).collect()),
                ),
                ("file", Value::str(&s.first_at.file)),
                ("line", Value::Num(s.first_at.line as i64)),
                ("exporter", exporter_json(f)),
            ]),
        ),
    ])
}

/// R3: who exported the handle (`null` for other rules).
fn exporter_json(f: &audit::Row) -> Value {
    f.exporter.as_ref().map_or(Value::Null, |x| {
        Value::Obj(vec![
            ("pid", Value::opt_num(x.pid)),
            ("rank", Value::opt_num(x.rank)),
            ("job", Value::opt_str(x.job.clone())),
            ("gpu", Value::opt_str(x.gpu.clone())),
            ("location", Value::opt_str(x.location.clone())),
            ("rank_root", root_json(x.rank_root.as_ref())),
        ])
    })
}

fn rank_json(r: &RankStats) -> Value {
    let f = &r.first;
    Value::Obj(vec![
        ("rank", Value::opt_num(r.rank)),
        ("rank_root", root_json(r.rank_root.as_ref())),
        ("count", Value::Num(r.count as i64)),
        ("denied", Value::Num(r.denied as i64)),
        ("warned", Value::Num(r.warned as i64)),
        ("processes", Value::Num(r.processes as i64)),
        (
            "first",
            Value::Obj(vec![
                ("ts", Value::opt_secs(f.ts.map(audit::micros))),
                ("host", Value::opt_str(f.host.clone())),
                ("pid", Value::opt_num(f.pid)),
                ("verdict", Value::str(&f.verdict)),
                ("mode", Value::opt_str(f.mode.clone())),
                ("abi", Value::opt_str(f.abi.clone())),
                ("args", Value::opt_str(f.args.clone())),
                ("ordinal", Value::opt_num(f.ordinal)),
                ("detail", Value::opt_str(f.detail.clone())),
                ("cvd", Value::opt_str(f.cvd.clone())),
                ("gpu", Value::opt_str(f.gpu.clone())),
                ("sees", Value::opt_str(f.sees.clone())),
                ("devices", Value::opt_num(f.devices)),
                ("rank_gpu", Value::opt_str(f.rank_gpu.clone())),
                ("rank_gpu_uuid", Value::opt_str(f.rank_gpu_uuid.clone())),
                ("job", Value::opt_str(f.job.clone())),
                ("file", Value::str(&r.first_at.file)),
                ("line", Value::Num(r.first_at.line as i64)),
                ("exporter", exporter_json(f)),
            ]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r3_names_the_exporter_in_text_and_json() {
        let mut a = Aggregator::new();
        a.add_line("f", 1, br#"{"ts":1.0,"call":"cuIpcOpenMemHandle","verdict":"deny","rule":"R3","pid":9,"host":"h","rank":0,"args":"flags=0x1","detail":"d","cvd":"0","exporter_pid":4,"exporter_rank":0,"exporter_job":null,"exporter_gpu":"GPU-1","exporter_location":"device"}"#, true);
        a.add_line("f", 2, br#"{"ts":2.0,"call":"cuIpcOpenEventHandle","verdict":"deny","rule":"R3","pid":9,"host":"h","rank":0,"exporter_pid":null,"exporter_gpu":null}"#, true);
        let s = a.finish();
        let t = text(&s, 1);
        assert!(
            t.contains("\n      exported by pid 4 (rank 0) on GPU-1 (device memory)\n"),
            "{t}"
        );
        assert!(
            t.contains("\n      exporter unknown (no trusted provenance record for the handle)\n"),
            "{t}"
        );
        let j = json_doc(&s, &["f".into()]).pretty();
        assert!(j.contains("\"exporter\": {\n"), "{j}");
        assert!(j.contains("\"location\": \"device\""), "{j}");
    }
}
