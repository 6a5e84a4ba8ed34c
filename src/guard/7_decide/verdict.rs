//! Verdict dispatch: what happens after a policy verdict that is not Allow, per mode:
//! deny with a code, record, count a repeat, or terminate. Everything here is on the cold
//! path except [`repeated`], inlined into the wrappers: an allowed call never gets here.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::atomic::Ordering;

use crate::config::Mode;
use crate::guard::audit::decision_record::{record_decision, record_decision_at, Extra};
use crate::guard::audit::tally;
use crate::guard::process::state;
use crate::guard::sys::ffi::{CuResult, CudaError};
use crate::guard::table::TABLE;
use crate::policy::{DenyCode, Verdict, Violation};
use rankguard_core::record::Action;

/// A CUDA result type the wrappers return.
pub trait Code: Copy {
    fn denied(code: DenyCode) -> Self;
    /// The real function could not be found.
    fn missing() -> Self;
}

impl Code for CuResult {
    fn denied(code: DenyCode) -> Self {
        match code {
            DenyCode::InvalidDevice => CuResult::INVALID_DEVICE,
            DenyCode::NotPermitted => CuResult::NOT_PERMITTED,
        }
    }
    fn missing() -> Self {
        CuResult::NOT_FOUND
    }
}

impl Code for CudaError {
    fn denied(code: DenyCode) -> Self {
        match code {
            DenyCode::InvalidDevice => CudaError::INVALID_DEVICE,
            DenyCode::NotPermitted => CudaError::NOT_PERMITTED,
        }
    }
    fn missing() -> Self {
        CudaError::SYMBOL_NOT_FOUND
    }
}

/// Marks the branch that calls it as unlikely (`gate!`): a call of a `#[cold]` function is
/// what LLVM's branch weights read as cold on stable Rust (`std::hint::cold_path` needs
/// 1.95, above this crate's rust-version). Costs a call and a return, on violations only.
#[cold]
#[inline(never)]
pub fn cold_path() {}

/// Act on a verdict that is not Allow. `Ok(())`: proceed to the real call. `Err(code)`:
/// return `code` to the caller.
#[cold]
#[inline(never)]
#[allow(dead_code)]
pub fn on_verdict<R: Code>(id: usize, verdict: Verdict, args: fmt::Arguments<'_>) -> Result<(), R> {
    on_verdict_at(id, verdict, args, None, 0)
}

/// [`on_verdict`] from a wrapper that knows its return address `ra` (`caller_address!`;
/// 0 = unknown): the key of a repeated violation's site (`tally.rs`).
#[cold]
#[inline(never)]
pub fn on_verdict_ra<R: Code>(
    id: usize,
    verdict: Verdict,
    args: fmt::Arguments<'_>,
    ra: usize,
) -> Result<(), R> {
    on_verdict_at(id, verdict, args, None, ra)
}

/// The repeated path (issue 19), inlined into each wrapper by `gate!` before anything is
/// formatted (a call into the engine would cost as much as the whole allowed call): a
/// violation from a return address already recorded in full as its own site is only
/// counted (one increment, `tally::bump`: no formatting, no syscall, no allocation, nothing that
/// can panic). `None`: not such a violation, take [`on_verdict_ra`].
#[inline(always)]
pub fn repeated<R: Code>(id: usize, verdict: Verdict, ra: usize) -> Option<Result<(), R>> {
    // (ra == 0 never has a return-address slot.)
    let Verdict::Violation(v) = verdict else {
        return None;
    };
    let deny = tally::counted_again(id, v.rule, ra)?;
    Some(if deny { Err(R::denied(v.code)) } else { Ok(()) })
}

/// [`on_verdict`] with extra report fields (R3 names the exporter).
#[cold]
#[inline(never)]
pub fn on_verdict_with<R: Code>(
    id: usize,
    verdict: Verdict,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
) -> Result<(), R> {
    on_verdict_at(id, verdict, args, extra, 0)
}

#[inline(never)]
fn on_verdict_at<R: Code>(
    id: usize,
    verdict: Verdict,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
    ra: usize,
) -> Result<(), R> {
    // Nothing below should panic, but this runs inside someone else's process behind an
    // FFI boundary: a panic in reporting must not unwind into C (Rust would abort the host
    // process), and must not let a violating call through. Fail closed instead.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        act(id, verdict, args, extra, ra)
    })) {
        Ok(r) => r,
        Err(_) => match verdict {
            Verdict::Violation(v) if !matches!(state::mode(), Mode::Warn | Mode::Off) => {
                Err(R::denied(v.code))
            }
            _ => Ok(()),
        },
    }
}

fn act<R: Code>(
    id: usize,
    verdict: Verdict,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
    ra: usize,
) -> Result<(), R> {
    let mode = state::mode();
    state::report_config_errors();
    match verdict {
        Verdict::Allow => Ok(()),
        Verdict::Query(v) => {
            if mode == Mode::Warn && first_query(id, v) {
                record_decision(id, &v, Action::Warn, mode, args, extra);
            }
            Ok(())
        }
        Verdict::Violation(v) => match mode {
            Mode::Off => Ok(()),
            // Every violation is counted; the first ones per site are written in full.
            Mode::Warn => {
                if let tally::Occ::Full { first, cap } = tally::occurrence(id, v.rule, false, ra) {
                    record_decision_at(id, &v, Action::Warn, mode, args, extra, &cap, first);
                }
                Ok(())
            }
            Mode::Enforce => {
                if let tally::Occ::Full { first, cap } = tally::occurrence(id, v.rule, true, ra) {
                    record_decision_at(id, &v, Action::Deny, mode, args, extra, &cap, first);
                }
                Err(R::denied(v.code))
            }
            Mode::Abort => {
                record_decision(id, &v, Action::Deny, mode, args, extra);
                crate::guard::decide::end_rank::refused(mode, &v);
                abort_now()
            }
        },
    }
}

/// Queries are recorded once per (symbol, ordinal): the real runtime queries every
/// attribute of every visible device at start-up, which would otherwise flood the audit.
fn first_query(id: usize, v: Violation) -> bool {
    match v.ordinal() {
        Some(o) if (0..64).contains(&o) => {
            let bit = 1u64 << o;
            TABLE[id].slot().queried.fetch_or(bit, Ordering::Relaxed) & bit == 0
        }
        _ => true,
    }
}

pub fn abort_now() -> ! {
    // SAFETY: abort has no preconditions; it raises SIGABRT for a core dump.
    unsafe { libc::abort() }
}
