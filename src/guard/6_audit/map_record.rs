//! The map record: one per guarded process, at its first `cuInit` (the R1 check), naming the
//! GPU it sees (docs/report.md, "The map record"). Written to the audit file so that a clean
//! job still shows which process saw which GPU (`rankguard report --map`), and said as one
//! sentence in the debug log at INFO. Cold path: once per process, never on an allowed call.

use std::borrow::Cow;

use crate::config::{Level, Mode};
use crate::guard::output::debug_log;
use crate::guard::process::root_walk;
use crate::guard::process::state;
use crate::guard::sys::signal_safe::{self, StackBuf};
use rankguard_core::record::{FixedWriter, MapR1, MapRecord, MAP_MAX};

/// What the R1 check learnt, for the map record.
pub struct MapFacts<'a> {
    pub mode: Mode,
    /// `CUDA_VISIBLE_DEVICES` at `cuInit` (raw bytes; None: unset).
    pub cvd: Option<&'a [u8]>,
    /// `CUDA_VISIBLE_DEVICES` the process was started with (None: unset or unknown).
    pub cvd_start: Option<&'a str>,
    pub devices: i32,
    /// The UUID of the one device the process sees ("" when none).
    pub own_uuid: &'a str,
    /// The rank's GPU when the R1 check named one beyond the launcher's and the root's (the
    /// single entry the process was started with).
    pub start_gpu: Option<&'a str>,
    pub r1: MapR1,
}

/// Write the map record (when `RANKGUARD_AUDIT` is set) and say it at INFO.
pub fn write(f: &MapFacts<'_>) {
    let audit = state::audit_on();
    if audit || debug_log::enabled(Level::Info) {
        write_now(f, audit);
    }
}

/// [`write`]'s work, a frame of its own: its buffers (~10 KB) would otherwise be inlined
/// into the R1 check's frame, whose stack probes then fault a page of stack at every first
/// `cuInit`, audit or not (docs/benchmarks.md, "The R1 check's frame").
#[cold]
#[inline(never)]
fn write_now(f: &MapFacts<'_>, audit: bool) {
    let cfg = &state::get().config;
    let mut cvd_buf = StackBuf::<512>::new();
    let cvd = f.cvd.map(|b| {
        let _ = signal_safe::escape_bytes(&mut cvd_buf, b);
        std::str::from_utf8(cvd_buf.as_bytes()).unwrap_or("?")
    });
    let mut host = [0u8; 64];
    let host = signal_safe::hostname(&mut host);
    let rec = MapRecord {
        ts_us: Some(signal_safe::now_us()),
        host: Some(Cow::Borrowed(host)),
        pid: signal_safe::pid(),
        start: root_walk::start_of(signal_safe::pid()),
        rank: cfg.rank,
        local_rank: cfg.local_rank,
        job: cfg.job.as_deref().map(Cow::Borrowed),
        rank_root: root_walk::current().and_then(|r| root_walk::as_ref(r, host)),
        mode: Some(f.mode),
        cvd: cvd.map(Cow::Borrowed),
        cvd_start: f.cvd_start.map(Cow::Borrowed),
        devices: f.devices,
        gpu: (!f.own_uuid.is_empty()).then_some(Cow::Borrowed(f.own_uuid)),
        rank_gpu: cfg
            .rank_gpu
            .as_deref()
            .or(root_walk::rank_gpu())
            .or(f.start_gpu)
            .map(Cow::Borrowed),
        rank_gpu_uuid: cfg.rank_gpu_uuid.as_deref().map(Cow::Borrowed),
        r1: Some(f.r1),
    };
    if audit {
        let mut buf = [0u8; MAP_MAX];
        let mut w = FixedWriter::new(&mut buf);
        // Cannot fail: MAP_MAX holds the worst record (record.rs, map_record_fits).
        if rec.write_json(&mut w).is_ok() {
            state::write_audit(w.as_bytes());
        }
    }
    if debug_log::enabled(Level::Info) {
        let mut line = StackBuf::<1024>::new();
        let _ = rec.write_line(&mut line);
        debug_log::log!(
            Info,
            "{}",
            std::str::from_utf8(line.as_bytes())
                .unwrap_or("")
                .trim_end()
        );
    }
}
