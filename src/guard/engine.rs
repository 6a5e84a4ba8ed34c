//! What happens after a policy verdict: per mode, deny with a code, record, or terminate;
//! and the R1 check at CUDA initialisation. Everything here is on the cold path: an
//! allowed call never gets here.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt::{self, Write};
use std::sync::atomic::Ordering;

use crate::config::Mode;
use crate::cvd;
use crate::guard::ffi::{CUdevice, CUuuid, CuResult, CudaError};
use crate::guard::internal;
use crate::guard::once::ForkSafeOnce;
use crate::guard::rank_root;
use crate::guard::real;
use crate::guard::report::{self, json_opt_str, json_str, StackBuf};
use crate::guard::state;
use crate::guard::table::{Id, TABLE};
use crate::guard::{site, tally};
use crate::policy::{self, DenyCode, InitFacts, Rule, Verdict, Violation};
use crate::rankgpu;
use rankguard_core::uuid::{write_uuid, UuidKind};

/// Exit status of a process terminated by R1 in enforce mode (sysexits' EX_CONFIG: the
/// process was started with a configuration that breaks the contract).
pub const EXIT_R1: i32 = 78;

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

/// `host:pid:tid [rank N] RANKGUARD LEVEL ` — the NCCL line shape users grep.
pub fn prefix<W: Write>(w: &mut W, level: &str) {
    let mut host = [0u8; 64];
    let host = report::hostname(&mut host);
    let _ = write!(w, "{host}:{}:{} ", report::pid(), report::tid());
    match (
        state::try_get().and_then(|s| s.config.rank),
        rank_root::current(),
    ) {
        (Some(r), _) => {
            let _ = write!(w, "[rank {r}] ");
        }
        (None, Some(root)) => {
            let _ = write!(w, "[rank root {}] ", root.id.pid);
        }
        (None, None) => {
            let _ = w.write_str("[rank -] ");
        }
    }
    let _ = write!(w, "RANKGUARD {level} ");
}

/// The real function of entry `id` is missing: say so once, return the defined error.
#[cold]
pub fn missing<R: Code>(id: usize) -> R {
    let e = &TABLE[id];
    if e.first_said(report::pid()) {
        let mut b = StackBuf::<512>::new();
        prefix(&mut b, "WARN");
        let lib = match e.lib {
            crate::guard::table::Lib::Driver => "libcuda.so.1",
            crate::guard::table::Lib::Runtime => "libcudart.so.12",
        };
        let _ = writeln!(
            b,
            "{}: the real function was not found in {lib}; returning error 500 (not found). Is the CUDA library installed and on the library path?",
            e.abi()
        );
        report::write_all(2, b.as_bytes());
    }
    R::missing()
}

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
/// counted (one atomic increment: no formatting, no syscall, no allocation, nothing that
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
                emit(id, &v, "warn", mode, args, extra);
            }
            Ok(())
        }
        Verdict::Violation(v) => match mode {
            Mode::Off => Ok(()),
            // Every violation is counted; the first ones per site are written in full.
            Mode::Warn => {
                if let tally::Occ::Full { first, cap } = tally::occurrence(id, v.rule, false, ra) {
                    emit_at(id, &v, "warn", mode, args, extra, &cap, first);
                }
                Ok(())
            }
            Mode::Enforce => {
                if let tally::Occ::Full { first, cap } = tally::occurrence(id, v.rule, true, ra) {
                    emit_at(id, &v, "deny", mode, args, extra, &cap, first);
                }
                Err(R::denied(v.code))
            }
            Mode::Abort => {
                emit(id, &v, "deny", mode, args, extra);
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
            TABLE[id].queried.fetch_or(bit, Ordering::Relaxed) & bit == 0
        }
        _ => true,
    }
}

fn abort_now() -> ! {
    // SAFETY: abort has no preconditions; it raises SIGABRT for a core dump.
    unsafe { libc::abort() }
}

/// Extra fields of a report beyond the common ones (R3 fills in the exporter).
pub struct Extra<'a> {
    /// JSON members, already rendered, starting with a comma.
    pub json: &'a str,
    /// Human text appended to the stderr line.
    pub human: &'a str,
}

/// Write the stderr line (first occurrence per symbol; the rest at debug level) and the
/// audit record for one decision, capturing its site here.
pub fn emit(
    id: usize,
    v: &Violation,
    verdict: &str,
    mode: Mode,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
) {
    let cap = site::capture(site::python_thread());
    let first = TABLE[id].first_said(report::pid());
    emit_at(id, v, verdict, mode, args, extra, &cap, first);
}

/// [`emit`] with the site already captured; `first`: the first line of this (rule, call,
/// site) in this process (`tally.rs`), said on stderr; later ones go to the debug log.
#[allow(clippy::too_many_arguments)]
pub fn emit_at(
    id: usize,
    v: &Violation,
    verdict: &str,
    mode: Mode,
    args: fmt::Arguments<'_>,
    extra: Option<Extra<'_>>,
    cap: &site::Capture,
    first: bool,
) {
    let e = &TABLE[id];
    let st = state::get();
    let _ = rank_root::ensure(&st.config);
    let cvd_raw = report::getenv_bytes("CUDA_VISIBLE_DEVICES");
    // A value that is not UTF-8 is shown with its bytes escaped (`\xff`), never as unset.
    let mut cvd_buf = StackBuf::<512>::new();
    let cvd_now = cvd_raw.map(|b| {
        let _ = report::escape_bytes(&mut cvd_buf, b);
        std::str::from_utf8(cvd_buf.as_bytes()).unwrap_or("?")
    });
    let gpu = state::owned_gpu();
    // The rank's GPU: the launcher's identity when there is one (a descendant that breaks
    // R1 sees another GPU than its rank owns), else the one this process sees.
    let rank_gpu = st
        .config
        .rank_gpu_uuid
        .as_deref()
        .or(st.config.rank_gpu.as_deref())
        .or(rank_root::rank_gpu())
        .or(gpu);
    let verdict_word = match (verdict, mode) {
        ("deny", Mode::Abort) => "aborting",
        ("deny", _) => "denied",
        _ => "allowed (warn mode)",
    };

    // Heap buffers (this is the cold path): a long site or stack is never cut mid-record.
    let mut line = String::with_capacity(1024);
    prefix(&mut line, "WARN");
    let _ = write!(
        line,
        "{}({args}) {verdict_word} [{} {}]: {}; CUDA_VISIBLE_DEVICES={}, rank GPU {}{}; fix: {}",
        e.call,
        v.rule.as_str(),
        v.rule.name(),
        v.detail,
        cvd_now.map_or("<unset>", |s| if s.is_empty() { "<empty>" } else { s }),
        rank_gpu.unwrap_or("unknown"),
        extra.as_ref().map_or("", |x| x.human),
        v.rule.fix(),
    );
    site::line_suffix(&mut line, cap);
    if first || mode == Mode::Abort || v.rule == Rule::R1 {
        report::write_all(2, line.as_bytes());
    } else {
        tracing::warn!("{}", String::from_utf8_lossy(line.as_bytes()).trim_end());
    }

    if state::audit_on() {
        let mut j = String::with_capacity(4096);
        let _ = audit_record(
            &mut j,
            e.call,
            e.abi(),
            v,
            verdict,
            mode,
            args,
            cvd_now,
            gpu,
            &st.config,
            extra.as_ref().map(|x| x.json),
        );
        site::record_fields(&mut j, cap);
        j.push_str(
            "}
",
        );
        state::write_audit(j.as_bytes());
    }
}

#[allow(clippy::too_many_arguments)]
fn audit_record<W: Write>(
    j: &mut W,
    call: &str,
    abi: &str,
    v: &Violation,
    verdict: &str,
    mode: Mode,
    args: fmt::Arguments<'_>,
    cvd_now: Option<&str>,
    gpu: Option<&str>,
    cfg: &crate::config::Config,
    extra_json: Option<&str>,
) -> fmt::Result {
    let mut host = [0u8; 64];
    let host = report::hostname(&mut host);
    write!(j, "{{\"ts\":{:.6},\"call\":", report::now())?;
    json_str(j, call, 64)?;
    j.write_str(",\"abi\":")?;
    json_str(j, abi, 64)?;
    write!(
        j,
        ",\"verdict\":\"{verdict}\",\"rule\":\"{}\",\"mode\":\"{}\"",
        v.rule.as_str(),
        mode.as_str()
    )?;
    write!(
        j,
        ",\"pid\":{},\"tid\":{},\"host\":",
        report::pid(),
        report::tid()
    )?;
    json_str(j, host, 64)?;
    match cfg.rank {
        Some(r) => write!(j, ",\"rank\":{r}")?,
        None => j.write_str(",\"rank\":null")?,
    }
    match cfg.local_rank {
        Some(r) => write!(j, ",\"local_rank\":{r}")?,
        None => j.write_str(",\"local_rank\":null")?,
    }
    j.write_str(",\"job\":")?;
    json_opt_str(j, cfg.job.as_deref(), 128)?;
    rank_root::write_json(j, rank_root::current())?;
    if let Some(o) = v.ordinal() {
        write!(j, ",\"ordinal\":{o}")?;
    }
    j.write_str(",\"cvd\":")?;
    json_opt_str(j, cvd_now, 256)?;
    j.write_str(",\"gpu\":")?;
    json_opt_str(j, gpu, 64)?;
    j.write_str(",\"rank_gpu\":")?;
    json_opt_str(j, cfg.rank_gpu.as_deref().or(rank_root::rank_gpu()), 128)?;
    let mut a = StackBuf::<512>::new();
    let _ = a.write_fmt(args);
    j.write_str(",\"args\":")?;
    json_str(j, std::str::from_utf8(a.as_bytes()).unwrap_or(""), 400)?;
    let mut d = StackBuf::<256>::new();
    let _ = write!(d, "{}", v.detail);
    j.write_str(",\"detail\":")?;
    json_str(j, std::str::from_utf8(d.as_bytes()).unwrap_or(""), 250)?;
    if let Some(x) = extra_json {
        j.write_str(x)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// R1 at CUDA initialisation

static INIT_CHECK: ForkSafeOnce = ForkSafeOnce::new();

/// Called by the `cuInit` wrapper after the real `cuInit` returned `rc`. The first call in
/// the process runs the R1 check; concurrent first calls wait for it, so no thread uses
/// CUDA before the verdict (a child forked in the middle of its parent's check runs its
/// own). A violation in enforce mode terminates the process here.
pub fn after_init(rc: CuResult) {
    if INIT_CHECK.is_done() {
        return;
    }
    INIT_CHECK.call(|| {
        // As in on_verdict_with: never unwind into the caller of cuInit. A check that
        // could not finish fails closed: in enforce mode the process is stopped as for
        // any R1 violation, since its visibility was not verified.
        if std::panic::catch_unwind(|| check_init(rc)).is_err() && state::mode() == Mode::Enforce {
            let mut b = StackBuf::<256>::new();
            prefix(&mut b, "WARN");
            let _ = writeln!(b, "terminating: the R1 check at CUDA initialisation could not finish (exit status {EXIT_R1})");
            report::write_all(2, b.as_bytes());
            // SAFETY: _exit has no preconditions (see check_init for why not exit()).
            unsafe { libc::_exit(EXIT_R1) }
        }
    });
}

fn check_init(rc: CuResult) {
    let mode = state::mode();
    state::report_config_errors();
    if mode == Mode::Off {
        return;
    }
    let cvd_text = report::getenv(c"CUDA_VISIBLE_DEVICES");
    let vis = cvd::parse(cvd_text);
    let entries = vis.entries().map_or(0, <[cvd::Entry]>::len);

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
    let rank_uuid = report::getenv_bytes("RANKGUARD_RANK_GPU_UUID");
    // No rank variables: the rank is the outermost ancestor that is one (rank_root.rs).
    let cfg = &state::get().config;
    let by_root = rank_root::ensure(cfg).is_some();
    let is_rank_gpu = match report::getenv_bytes("RANKGUARD_RANK_GPU") {
        Some(entry) => Some(rankgpu::decide(entry, rank_uuid, own_uuid, vis.entries()).is_same()),
        None => rank_root::is_rank_gpu(own_uuid, &vis),
    };
    let facts = InitFacts {
        cvd_set: cvd_text.is_some(),
        entries,
        devices,
        is_rank_gpu,
    };
    tracing::debug!(?facts, uuid = own_uuid, "R1 check at cuInit");
    let verdict = policy::init(facts);
    if by_root && (verdict.is_allow() || mode == Mode::Warn) {
        // A process that sees exactly one GPU records its rank for its descendants.
        let sees_rank_gpu = entries == 1 && devices == 1 && is_rank_gpu != Some(false);
        rank_root::publish(cfg, own_uuid, sees_rank_gpu);
    }
    let Verdict::Violation(v) = verdict else {
        return;
    };
    let id = Id::cuInit as usize;
    let mut human = StackBuf::<256>::new();
    if v.detail == policy::Detail::NotRankGpu {
        let _ = write!(
            human,
            "; this process sees {}",
            if own_uuid.is_empty() {
                "no identifiable GPU"
            } else {
                own_uuid
            }
        );
    }
    let mut json = StackBuf::<256>::new();
    let _ = write!(
        json,
        ",\"devices\":{devices},\"entries\":{entries},\"sees\":"
    );
    let _ = json_opt_str(
        &mut json,
        if own_uuid.is_empty() {
            None
        } else {
            Some(own_uuid)
        },
        64,
    );
    let extra = Extra {
        json: std::str::from_utf8(json.as_bytes()).unwrap_or(""),
        human: std::str::from_utf8(human.as_bytes()).unwrap_or(""),
    };
    match mode {
        Mode::Warn => emit(id, &v, "warn", mode, format_args!("flags=0"), Some(extra)),
        Mode::Abort => {
            emit(id, &v, "deny", mode, format_args!("flags=0"), Some(extra));
            abort_now()
        }
        Mode::Enforce | Mode::Off => {
            emit(id, &v, "deny", mode, format_args!("flags=0"), Some(extra));
            let mut b = StackBuf::<256>::new();
            prefix(&mut b, "WARN");
            let _ = writeln!(b, "terminating: this process breaks rule R1 at CUDA initialisation (exit status {EXIT_R1}; RANKGUARD_MODE=warn lets it run for debugging)");
            report::write_all(2, b.as_bytes());
            // SAFETY: _exit has no preconditions. It skips atexit handlers on purpose:
            // we are inside a CUDA call on an arbitrary thread of someone else's process,
            // where running their handlers could deadlock; our message is already written.
            unsafe { libc::_exit(EXIT_R1) }
        }
    }
}

fn driver_count() -> Option<i32> {
    let f = internal::cuDeviceGetCount()?;
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer.
    (unsafe { f(&mut n) } == CuResult::SUCCESS).then_some(n)
}

/// The UUID of the device with this ordinal, from the real driver.
pub fn device_uuid_bytes(ordinal: i32) -> Option<CUuuid> {
    let get = real::get(Id::cuDeviceGet as usize);
    let uuid = real::get(Id::cuDeviceGetUuid_v2 as usize);
    let uuid = if uuid.is_null() {
        real::get(Id::cuDeviceGetUuid as usize)
    } else {
        uuid
    };
    if get.is_null() || uuid.is_null() {
        return None;
    }
    // SAFETY: these are the driver's cuDeviceGet(CUdevice*, int) and
    // cuDeviceGetUuid(_v2)(CUuuid*, CUdevice).
    let (get, uuid): (
        unsafe extern "C" fn(*mut CUdevice, i32) -> CuResult,
        unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CuResult,
    ) = unsafe {
        (
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut CUdevice, i32) -> CuResult>(
                get,
            ),
            std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CuResult,
            >(uuid),
        )
    };
    let mut dev: CUdevice = 0;
    let mut u = CUuuid { bytes: [0; 16] };
    // SAFETY: valid out-pointers.
    unsafe {
        if get(&mut dev, ordinal) != CuResult::SUCCESS || uuid(&mut u, dev) != CuResult::SUCCESS {
            return None;
        }
    }
    Some(u)
}

/// The UUID text of the device with this ordinal: `MIG-...` when CUDA_VISIBLE_DEVICES names
/// MIG instances (cuDeviceGetUuid_v2 returns the instance's UUID), else `GPU-...`.
pub fn device_uuid(ordinal: i32) -> Option<String> {
    let u = device_uuid_bytes(ordinal)?;
    let mig = report::getenv(c"CUDA_VISIBLE_DEVICES").is_some_and(|t| t.starts_with("MIG-"));
    let mut b = StackBuf::<64>::new();
    let kind = if mig { UuidKind::Mig } else { UuidKind::Gpu };
    let _ = write_uuid(&mut b, kind, &u.bytes);
    Some(String::from_utf8_lossy(b.as_bytes()).into_owned())
}

/// The device of a context, asked from the real driver without disturbing the caller's
/// current context (push, query, pop).
pub fn context_device(ctx: *mut c_void) -> Option<i32> {
    let (push, pop, getdev) = (
        internal::cuCtxPushCurrent_v2()?,
        internal::cuCtxPopCurrent_v2()?,
        internal::cuCtxGetDevice()?,
    );
    if ctx.is_null() {
        let mut d = 0;
        // SAFETY: valid out-pointer; a NULL context means "the current one".
        return (unsafe { getdev(&mut d) } == CuResult::SUCCESS).then_some(d);
    }
    // SAFETY: push/pop are balanced; the out-pointers are valid.
    unsafe {
        if push(ctx) != CuResult::SUCCESS {
            return None;
        }
        let mut d = 0;
        let ok = getdev(&mut d) == CuResult::SUCCESS;
        let mut popped = std::ptr::null_mut();
        let _ = pop(&mut popped);
        ok.then_some(d)
    }
}

/// A guarded API's entry point came back as a pointer matching none of its ABI variants
/// we know: say so (once per process) and refuse it.
#[cold]
pub fn unknown_variant(symbol: *const std::ffi::c_char) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let name = if symbol.is_null() {
        "?"
    } else {
        // SAFETY: a non-NULL symbol argument is a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(symbol) }
            .to_str()
            .unwrap_or("?")
    };
    let mut b = StackBuf::<512>::new();
    prefix(&mut b, "WARN");
    let _ = writeln!(
        b,
        "entry point for {name} is an ABI variant this guard does not know (newer driver?); refusing it (pointer NULL, status not found) rather than handing out an unguarded function. Upgrade rankguard."
    );
    report::write_all(2, b.as_bytes());
}

/// The runtime's current device, asked from the real runtime; 0 if it cannot tell.
pub fn runtime_current_device() -> i32 {
    let Some(f) = internal::cudaGetDevice() else {
        return 0;
    };
    let mut d = 0;
    // SAFETY: valid out-pointer.
    if unsafe { f(&mut d) } == CudaError::SUCCESS {
        d
    } else {
        0
    }
}
