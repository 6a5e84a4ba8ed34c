//! The record of one decision: built once from the guard's state as a typed
//! [`AuditRecord`] (rankguard-core), rendered as the stderr line and the JSON audit record
//! into one scratch mapping, and written. Also the NCCL-shaped line prefix every message
//! of the guard starts with.

use std::fmt::{self, Write};

use crate::config::{Config, Mode};
use crate::guard::audit::site;
use crate::guard::output::debug_log;
use crate::guard::process::root_walk;
use crate::guard::process::state;
use crate::guard::sys::signal_safe::{self, StackBuf};
use crate::guard::table::{Entry, TABLE};
use crate::policy::{Rule, Violation};
use rankguard_core::record::{
    Action, AuditRecord, FixedWriter, RuleFields, RuleId, Text, CUT_MARK, FIXED_MAX, RECORD_MAX,
};
use std::borrow::Cow;

/// The line prefix (`output::line`), here too for the layers above, which write decisions.
pub use crate::guard::output::line::prefix;

/// The rule-specific facts a report carries beyond the common ones (R1's view of the
/// devices, R3's exporter), and the GPU the reporter says this process sees when it knows
/// better than the R1 check (None: the R1 check's).
#[derive(Default)]
pub struct Extra<'a> {
    pub fields: RuleFields<'a>,
    pub gpu: Option<&'a str>,
}

/// Write the stderr line (first occurrence per symbol; the rest at debug level) and the
/// audit record for one decision, capturing its site here.
pub fn record_decision(
    id: usize,
    v: &Violation,
    action: Action,
    mode: Mode,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
) {
    let cap = site::capture(site::python_thread());
    let first = TABLE[id].first_said(signal_safe::pid());
    record_decision_at(id, v, action, mode, args, extra, &cap, first);
}

fn b(s: &str) -> Text<'_> {
    Cow::Borrowed(s)
}

fn text(bytes: &[u8]) -> Text<'_> {
    Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or(""))
}

/// Room for the stderr line: every field of it is capped (`record::caps`), so it is far
/// below this; the rest of the scratch page holds the JSON record.
const LINE_MAX: usize = 8 * 1024;

/// [`record_decision`] with the site already captured; `first`: the first line of this (rule, call,
/// site) in this process (`tally.rs`), said on stderr; later ones go to the debug log.
///
/// The record is built once ([`AuditRecord`]) from borrowed facts and rendered twice into
/// one scratch mapping (`signal_safe::Scratch`): no allocation, so a forked child or a signal
/// never finds us waiting on the allocator's lock.
#[allow(clippy::too_many_arguments)]
pub fn record_decision_at(
    id: usize,
    v: &Violation,
    action: Action,
    mode: Mode,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
    cap: &site::Capture,
    first: bool,
) {
    let e = &TABLE[id];
    let st = state::get();
    let cfg = &st.config;
    let _ = root_walk::ensure(cfg);
    let extra = extra.unwrap_or_default();
    // A value that is not UTF-8 is shown with its bytes escaped (`\xff`), never as unset.
    let mut cvd_buf = StackBuf::<512>::new();
    let cvd_now = signal_safe::getenv_bytes("CUDA_VISIBLE_DEVICES").map(|b| {
        let _ = signal_safe::escape_bytes(&mut cvd_buf, b);
        std::str::from_utf8(cvd_buf.as_bytes()).unwrap_or("?")
    });
    let mut host = [0u8; 64];
    let host = signal_safe::hostname(&mut host);
    let mut args_buf = StackBuf::<512>::new();
    let _ = args_buf.write_fmt(args);
    let mut detail_buf = StackBuf::<256>::new();
    let _ = write!(detail_buf, "{}", v.detail);
    let rec = AuditRecord {
        tid: Some(signal_safe::tid()),
        ordinal: v.ordinal(),
        cvd: cvd_now.map(b),
        gpu: extra.gpu.or(state::owned_gpu()).map(b),
        rank_gpu: cfg
            .rank_gpu
            .as_deref()
            .or(root_walk::rank_gpu())
            .or(state::start_gpu())
            .map(b),
        rank_gpu_uuid: cfg.rank_gpu_uuid.as_deref().map(b),
        args: Some(text(args_buf.as_bytes())),
        detail: Some(text(detail_buf.as_bytes())),
        rule_fields: extra.fields,
        site: cap.site.as_deref().map(b),
        py_stack: Cow::Borrowed(&cap.py_stack),
        py_stack_cut: cap.py_cut,
        native_stack: Cow::Borrowed(&cap.native_stack),
        native_stack_cut: cap.native_cut,
        ..process_record(
            Some(e),
            action,
            v.rule,
            mode,
            signal_safe::now_us(),
            host,
            cfg,
        )
    };

    let loud = first || mode == Mode::Abort || v.rule == Rule::R1;
    match signal_safe::Scratch::new(LINE_MAX + RECORD_MAX) {
        Some(mut page) => say_and_write(&rec, page.bytes(), loud),
        None => say_and_write_on_stack(&rec, loud),
    }
}

/// The part of a record every record of this process carries, a decision's
/// ([`record_decision_at`]) and a repeat summary's (`tally`): the call, the verdict, when,
/// and the process (pid, host, rank, job, the rank root it found). `entry`: None for a
/// summary whose entry is unknown (`?`).
pub fn process_record<'a>(
    entry: Option<&Entry>,
    action: Action,
    rule: Rule,
    mode: Mode,
    ts_us: u64,
    host: &'a str,
    cfg: &'a Config,
) -> AuditRecord<'a> {
    AuditRecord {
        ts_us: Some(ts_us),
        call: b(entry.map_or("?", Entry::call)),
        abi: Some(b(entry.map_or("?", Entry::abi))),
        action: Some(action),
        rule: Some(RuleId::Known(rule)),
        mode: Some(mode),
        pid: Some(signal_safe::pid()),
        host: Some(b(host)),
        rank: cfg.rank,
        local_rank: cfg.local_rank,
        job: cfg.job.as_deref().map(b),
        rank_root: root_walk::current().and_then(|r| root_walk::as_ref(r, host)),
        ..AuditRecord::default()
    }
}

/// Without a scratch mapping (the address space is exhausted): a stack buffer that holds
/// the line and any record without its stacks (`FIXED_MAX`), so the record is still
/// written whole, with as many frames as fit. Its own frame, so the common path does not
/// reserve this stack.
#[cold]
#[inline(never)]
fn say_and_write_on_stack(rec: &AuditRecord<'_>, loud: bool) {
    let mut buf = [0u8; LINE_MAX + FIXED_MAX];
    say_and_write(rec, &mut buf, loud);
}

/// The level word of a decision's line: `DENY` for a denied (or stopped) call, `WARN` for
/// one warn mode let through.
pub fn tag(action: Action) -> &'static str {
    match action {
        Action::Deny => "DENY",
        Action::Warn => "WARN",
    }
}

/// Render the line into the first [`LINE_MAX`] bytes of `buf` and say it (stderr when
/// `loud`, else the debug log); render the JSON into the rest and append it to the audit.
fn say_and_write(rec: &AuditRecord<'_>, buf: &mut [u8], loud: bool) {
    let (line_buf, json_buf) = buf.split_at_mut(LINE_MAX);
    let mut line = FixedWriter::new(line_buf);
    // A denial says it is one: users grep `RANKGUARD DENY` apart from warn mode's lines.
    prefix(&mut line, rec.action.map_or("WARN", tag));
    if rec.write_line(&mut line).is_err() || line.overflowed() {
        // Not reached with the caps; a cut line still ends as one.
        line.truncate(line.len().saturating_sub(CUT_MARK.len() + 1));
        let _ = line.write_str(CUT_MARK);
        let _ = line.write_char('\n');
    }
    if loud {
        signal_safe::write_all(2, line.as_bytes());
    } else {
        // Already a whole line (prefix and newline): the debug log takes it as it is.
        if debug_log::enabled(rankguard_core::config::Level::Warn) {
            debug_log::write_line(line.as_bytes());
        }
    }
    if state::audit_on() {
        let mut j = FixedWriter::new(json_buf);
        // Cannot fail: the buffer holds at least FIXED_MAX (record.rs).
        if rec.write_json(&mut j).is_ok() {
            state::write_audit(j.as_bytes());
        }
    }
}
