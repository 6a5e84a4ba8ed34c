//! R1 at CUDA initialisation: the first `cuInit` that reaches the guard checks that the
//! process sees exactly one GPU, the rank's, and stops it (enforce) or records it (warn).
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::config::Mode;
use crate::cvd;
use crate::guard::audit::decision_record::{record_decision, Extra};
use crate::guard::audit::map_record::{self, MapFacts};
use crate::guard::decide::end_rank;
use crate::guard::decide::verdict::abort_now;
use crate::guard::output::debug_log;
use crate::guard::output::line::say;
use crate::guard::process::driver_query::{self, device_uuid, driver_count};
use crate::guard::process::root_walk;
use crate::guard::process::start_env;
use crate::guard::process::state;
use crate::guard::sys::ffi::CuResult;
use crate::guard::sys::signal_safe;
use crate::guard::table::Id;
use crate::policy::{self, InitFacts, Rule, Unreadable, Verdict};
use crate::rankgpu;
use rankguard_core::record::{Action, MapR1, RuleFields};
use std::borrow::Cow;

/// Exit status of a process terminated by R1 in enforce mode (sysexits' EX_CONFIG: the
/// process was started with a configuration that breaks the contract).
pub const EXIT_R1: i32 = 78;

// R1 at CUDA initialisation

// The R1 check's one-time state and its thread live where the slots are published
// (`real::verdict_gate`).
use crate::guard::resolve::real::{R1_CHECK as INIT_CHECK, R1_CHECKER as CHECKER_TID};

/// The `cuInit` wrapper's body: `real_init` is the real `cuInit`. The first call in the
/// process claims the R1 check *before* the driver is initialised, runs the real `cuInit`
/// and then the check; concurrent first calls wait for it, and so does every other guarded
/// driver call of any thread (`real::verdict_gate`), so no thread uses CUDA before the verdict
/// (a child forked in the middle of its parent's check runs its own). A violation in
/// enforce mode terminates the process here.
pub fn around_init(real_init: impl Fn() -> CuResult) -> CuResult {
    if INIT_CHECK.is_done() {
        return real_init();
    }
    let mut first = None;
    INIT_CHECK.call(|| {
        CHECKER_TID.store(signal_safe::tid(), Ordering::Relaxed);
        let rc = real_init();
        first = Some(rc);
        // As in on_verdict_with: never unwind into the caller of cuInit. A check that
        // could not finish fails closed: in enforce mode the process is stopped as for
        // any R1 violation, since its visibility was not verified.
        if std::panic::catch_unwind(|| check_init(rc)).is_err() && state::mode() == Mode::Enforce {
            say("DENY", format_args!("terminating: the R1 check at CUDA initialisation could not finish (exit status {EXIT_R1})"));
            end_rank::end_rank(Mode::Enforce, Rule::R1, "the R1 check at CUDA initialisation could not finish");
            // SAFETY: _exit has no preconditions (see check_init for why not exit()).
            unsafe { libc::_exit(EXIT_R1) }
        }
    });
    // A caller that waited for another thread's check initialises the driver itself (the
    // driver's cuInit is idempotent), as it would have without the guard.
    first.unwrap_or_else(real_init)
}

fn check_init(rc: CuResult) {
    let mode = state::mode();
    state::report_config_errors();
    if mode == Mode::Off {
        return;
    }
    crate::guard::decide::narrow::report_at_init(mode, EXIT_R1);
    let cvd_text = signal_safe::getenv(c"CUDA_VISIBLE_DEVICES");
    let vis = cvd::parse(cvd_text);
    let entries = vis.entries().map_or(0, <[cvd::CvdEntry]>::len);
    // Entries CUDA does not read (`0,-1`): R1 is decided on those it reads, as `rankguard
    // check` decides it; both say the rest in the same words (crate::cvd::unread).
    if let Some(u) = cvd_text.and_then(cvd::unread) {
        say(
            "WARN",
            format_args!("{}", u.describe(cvd_text.unwrap_or(""))),
        );
    }

    let mut devices = 0;
    if rc == CuResult::SUCCESS {
        if let Some(count) = driver_count() {
            devices = count;
        }
    }
    let mut own_uuid = String::new();
    if devices == 1 {
        if let Some(u) = device_uuid(0) {
            state::set_owned_gpu(u.clone());
            own_uuid = u;
        }
    }
    let own_uuid = own_uuid.as_str();
    // The raw values: an empty, non-UTF-8 or unverifiable rank GPU fails closed, exactly
    // as `rankguard check` decides it (one shared function).
    let rank_uuid = signal_safe::getenv_bytes("RANKGUARD_RANK_GPU_UUID");
    // No rank variables: the rank is the outermost ancestor that is one (root_walk.rs).
    let cfg = &state::get().config;
    // A walk that could not read /proc (the fd table full) fails closed (policy::init).
    let (walk, opened) = root_walk::ensure_at_init(cfg);
    let by_root = matches!(walk, Ok(Some(_)));
    let is_rank_gpu = match signal_safe::getenv_bytes("RANKGUARD_RANK_GPU") {
        Some(entry) => Some(rankgpu::decide(entry, rank_uuid, own_uuid, vis.entries()).is_same()),
        None => root_walk::is_rank_gpu(own_uuid, &vis),
    };
    let start = start_env::cvd();
    let kept_start_gpu = start_gpu_kept(&start, own_uuid, &vis);
    // One entry, no device: the driver answers cuInit NO_DEVICE and cannot say which GPUs
    // exist; NVML (which ignores CVD) can.
    let node_gpus = if entries == 1 && devices == 0 {
        driver_query::node_gpu_count()
    } else {
        None
    };
    let facts = InitFacts {
        cvd_set: cvd_text.is_some(),
        entries,
        devices,
        is_rank_gpu,
        // A start environment that could not be read fails closed as the walk does (when it
        // could have bound the one entry the process sees); with a rank variable there is
        // no walk, and the process runs, told what was not checked (start_unread).
        walk_unreadable: walk.err().or(start
            .as_ref()
            .err()
            .copied()
            .filter(|_| entries == 1 && root_walk::applies(cfg))),
        kept_start_gpu,
        node_gpus,
    };
    if let (Err(u), 1, None) = (&start, entries, facts.walk_unreadable) {
        start_unread(u);
    }
    say_facts(&facts, cvd_text, own_uuid);
    let verdict = policy::init(facts);
    map_record::write(&MapFacts {
        mode,
        cvd: signal_safe::getenv_bytes("CUDA_VISIBLE_DEVICES"),
        cvd_start: start.as_ref().ok().and_then(|s| s.as_deref()),
        devices,
        own_uuid,
        start_gpu: state::start_gpu(),
        r1: match (&verdict, mode) {
            (Verdict::Violation(_), Mode::Warn) => MapR1::Warn,
            (Verdict::Violation(_), _) => MapR1::Deny,
            _ => MapR1::Ok,
        },
    });
    if by_root && (verdict.is_allow() || mode == Mode::Warn) {
        // A process that sees exactly one GPU records its rank for its descendants.
        let sees_rank_gpu = entries == 1 && devices == 1 && is_rank_gpu != Some(false);
        root_walk::publish(
            cfg,
            own_uuid,
            sees_rank_gpu,
            kept_start_gpu == Some(true),
            opened,
        );
    }
    let Verdict::Violation(v) = verdict else {
        if mode == Mode::Enforce {
            end_rank::arm(); // a refused descendant ends this process with 78 (end_rank.rs)
        }
        return;
    };
    let id = Id::cuInit as usize;
    let extra = || {
        Some(Extra {
            fields: RuleFields::Init {
                devices,
                entries: entries as u32,
                sees: (!own_uuid.is_empty()).then_some(Cow::Borrowed(own_uuid)),
            },
            gpu: None,
        })
    };
    match mode {
        Mode::Warn => record_decision(id, &v, Action::Warn, mode, format_args!("flags=0"), extra()),
        Mode::Abort => {
            record_decision(id, &v, Action::Deny, mode, format_args!("flags=0"), extra());
            end_rank::refused(mode, &v);
            abort_now()
        }
        Mode::Enforce | Mode::Off => {
            record_decision(id, &v, Action::Deny, mode, format_args!("flags=0"), extra());
            say("DENY", format_args!("terminating: this process breaks rule R1 at CUDA initialisation (exit status {EXIT_R1}; RANKGUARD_MODE=warn lets it run for debugging)"));
            end_rank::refused(mode, &v);
            // SAFETY: _exit has no preconditions. It skips atexit handlers on purpose:
            // we are inside a CUDA call on an arbitrary thread of someone else's process,
            // where running their handlers could deadlock; our message is already written.
            unsafe { libc::_exit(EXIT_R1) }
        }
    }
}

/// R1's rule for the process's own start (`rankgpu::started_with`): whether the one device
/// it sees is the GPU its single-entry start CVD named (None: not started with one). When it
/// is not, that entry is remembered as the rank's GPU for this process's records.
fn start_gpu_kept(
    start: &Result<Option<String>, Unreadable>,
    own_uuid: &str,
    vis: &cvd::Visibility,
) -> Option<bool> {
    let start = start.as_ref().ok()?.as_deref();
    let kept = rankgpu::started_with(start, own_uuid, vis.entries())?.is_same();
    if !kept {
        if let Some(entry) = crate::rank_root::single_entry(start) {
            state::set_start_gpu(entry);
        }
    }
    Some(kept)
}

/// The start environment could not be read and nothing failed closed on it (a rank variable
/// names the rank): say what was not checked, once (the R1 check runs once per process).
fn start_unread(u: &Unreadable) {
    say(
        "WARN",
        format_args!(
            "/proc/{}/{} could not be read (OS error {}): whether this process re-pointed the CUDA_VISIBLE_DEVICES it was started with is not checked; fix: leave fds free at the first cuInit (ulimit -n)",
            u.pid, u.file, u.errno
        ),
    );
}

/// The R1 check's facts as a sentence in the debug log (DEBUG).
fn say_facts(f: &InitFacts, cvd_text: Option<&str>, own_uuid: &str) {
    let cvd = match cvd_text {
        None => "unset",
        Some("") => "empty",
        Some(t) => t,
    };
    let rank_gpu = match f.is_rank_gpu {
        None => "no rank GPU is named",
        Some(true) => "it is the rank's GPU",
        Some(false) => "it is not the rank's GPU",
    };
    let start = match f.kept_start_gpu {
        None => "it was not started with a single CUDA_VISIBLE_DEVICES entry",
        Some(true) => "it is the GPU the process was started with",
        Some(false) => "it is not the GPU the process was started with",
    };
    debug_log::log!(
        Debug,
        "R1 check at cuInit: CUDA_VISIBLE_DEVICES is {cvd} ({} entr{} CUDA reads), the driver enumerates {} device{}{}{}; {rank_gpu}; {start}{}",
        f.entries,
        if f.entries == 1 { "y" } else { "ies" },
        f.devices,
        if f.devices == 1 { "" } else { "s" },
        if own_uuid.is_empty() { "" } else { ", " },
        own_uuid,
        if f.walk_unreadable.is_some() { "; the rank's ancestors could not be read" } else { "" },
    );
}
