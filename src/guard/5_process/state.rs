//! Per-process state: the configuration (read at the first guarded call, never in a
//! constructor: the only load-time code is `decide::narrow`'s), the audit and debug sinks,
//! and the identity the R1 check established.
//!
//! All of it lives in fork-safe one-time cells ([`crate::guard::sys::lifecycle`]): set once, read
//! lock-free afterwards, and a child forked while another thread of its parent was setting
//! one up does the set-up itself instead of waiting forever for a thread it does not have.
//! Nothing else depends on the pid (reports call getpid each time; the sinks check their
//! descriptor before each write), so a forked child inherits a finished state, and its
//! reports carry its own pid. The one per-process flag is `CONFIG_WARNED`, a
//! [`crate::guard::sys::lifecycle::PerProcess`]: a forked child says its own configuration
//! warnings once.
#![allow(unsafe_code)]

use crate::config::{Config, Mode};
use crate::guard::output::debug_log;
use crate::guard::output::line;
use crate::guard::output::sink;
use crate::guard::resolve::real;
use crate::guard::sys::lifecycle::{ForkSafeCell, PerProcess};
use crate::guard::sys::signal_safe;
use crate::guard::table::{Id, TABLE};

pub struct State {
    pub config: Config,
    /// True in secure-execution (setuid/setgid) processes: the guard stays inert there,
    /// since it must not act on an environment an unprivileged user controls.
    pub inert: bool,
}

static STATE: ForkSafeCell<State> = ForkSafeCell::new();

/// The identity of this process's one GPU, once R1 was checked.
static OWNED_GPU: ForkSafeCell<String> = ForkSafeCell::new();

/// The single CVD entry the process was started with, once R1 found it re-pointed.
static START_GPU: ForkSafeCell<String> = ForkSafeCell::new();

/// The state, initialising it on first use.
#[inline]
pub fn get() -> &'static State {
    match STATE.get() {
        Some(s) => s,
        None => init(),
    }
}

/// The state if it is initialised; never initialises (safe to call from within `init`).
#[inline]
pub fn try_get() -> Option<&'static State> {
    STATE.get()
}

/// The mode in force (Off when inert).
#[inline]
pub fn mode() -> Mode {
    let s = get();
    if s.inert {
        Mode::Off
    } else {
        s.config.mode
    }
}

#[cold]
fn init() -> &'static State {
    let s = STATE.get_or_init(|| {
        // SAFETY: getauxval has no preconditions; AT_SECURE is set by the kernel for
        // setuid/setgid/capability-raising executions.
        let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
        // dlopen()ed by the program instead of preloaded: the program's own CUDA calls
        // never reach the wrappers (only calls through that handle would), so guarding
        // them would be a false promise. Stay inert and say so once (issue 14, item 12).
        let dlopened = !secure && !interposing();
        if dlopened {
            line::say(
                "WARN",
                format_args!("librankguard.so was loaded with dlopen(), not preloaded: it cannot see this program's CUDA calls, so it stays inert (checks nothing, passes calls through). Preload it instead: LD_PRELOAD=$(rankguard lib)"),
            );
        }
        let inert = secure || dlopened;
        // A value that is not UTF-8 is read lossily: an invalid mode is then reported as
        // invalid (and means enforce), an invalid path is refused (config.rs).
        let config = Config::from_lookup(|k| {
            signal_safe::getenv_bytes(k).map(|b| String::from_utf8_lossy(b).into_owned())
        });
        let state = State { config, inert };
        if !inert {
            if let Some(t) = &state.config.audit {
                sink::AUDIT.open_now(t);
            }
        }
        state
    });
    line::set_rank(s.config.rank);
    if !s.inert {
        init_debug(&s.config);
    }
    s
}

/// Whether the program's own symbol lookups can reach our wrappers. The global scope (the
/// main program's handle) resolves `cuInit` to ours when the library is preloaded; to
/// nothing, or to the driver's own, when it was dlopen()ed (RTLD_LOCAL, or RTLD_GLOBAL after
/// the driver). Any other answer is an interposer preloaded in front of us (HAMi-core and
/// the like), whose calls reach us through RTLD_NEXT: still interposing.
fn interposing() -> bool {
    // A program linked with the driver, this library's `cuInit` the first one loaded: the
    // lookup below would find it (sys::libcsym), known without opening a handle.
    if crate::guard::sys::libcsym::ours_first_in_global_scope() {
        return true;
    }
    let ours = TABLE[Id::cuInit as usize].wrapper();
    // SAFETY: dlopen(NULL) returns the main program's handle, whose lookups search the
    // global scope only (RTLD_DEFAULT from here would also search our own local scope).
    let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY) };
    if main.is_null() {
        return true;
    }
    let global = real::lookup(main, c"cuInit") as *const std::ffi::c_void;
    if global == ours {
        return true;
    }
    if global.is_null() {
        return false;
    }
    // SAFETY: RTLD_NOLOAD only returns a handle of an already loaded libcuda.so.1 (loading
    // nothing); the name is NUL-terminated.
    let drv = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if drv.is_null() {
        return true;
    }
    let real_init = real::lookup(drv, c"cuInit") as *const std::ffi::c_void;
    // SAFETY: `drv` came from dlopen above; this drops the reference RTLD_NOLOAD added.
    unsafe { libc::dlclose(drv) };
    global != real_init
}

/// Append one audit record (see [`sink`]).
pub fn write_audit(bytes: &[u8]) {
    let s = get();
    if s.inert {
        return;
    }
    if let Some(t) = &s.config.audit {
        sink::AUDIT.write(t, bytes);
    }
}

/// Whether audit records are configured (and the guard is not inert).
pub fn audit_on() -> bool {
    let s = get();
    !s.inert && s.config.audit.is_some()
}

/// A configuration problem, said on stderr.
fn warn_once_config(var: &str, value: &str, what: &str) {
    line::say(
        "WARN",
        format_args!(
            "{var}=\"{}\" {what}",
            signal_safe::Mid(value, signal_safe::VALUE_MAX)
        ),
    );
}

static CONFIG_WARNED: PerProcess = PerProcess::new();

/// Say each invalid configuration value once per process.
pub fn report_config_errors() {
    // Nothing to say, the usual case, first: the violation path calls this each time.
    let cfg = &get().config;
    if (cfg.errors.is_empty() && cfg.job_notice.is_none()) || !CONFIG_WARNED.first() {
        return;
    }
    for e in &cfg.errors {
        warn_once_config(
            e.var,
            &e.value,
            &format!("is not valid: expected {}", e.expected),
        );
    }
    if let Some(notice) = cfg.job_notice {
        line::say("WARN", format_args!("{notice}"));
    }
}

/// Remember the GPU the process was started with, when it re-pointed itself to another
/// (set once by the R1 check): the rank's GPU its records name.
pub fn set_start_gpu(entry: String) {
    START_GPU.set(entry);
}

pub fn start_gpu() -> Option<&'static str> {
    START_GPU.get().map(String::as_str)
}

fn init_debug(cfg: &'static Config) {
    let Some(level) = cfg.debug else { return };
    // Open the debug file now, so that a problem with it is said up front.
    if let Some(t) = &cfg.debug_file {
        sink::DEBUG.open_now(t);
    }
    debug_log::set_file(cfg.debug_file.as_deref());
    debug_log::set_level(level);
}

/// Remember the identity of the process's GPU (set once by the R1 check).
pub fn set_owned_gpu(uuid: String) {
    OWNED_GPU.set(uuid);
}

pub fn owned_gpu() -> Option<&'static str> {
    OWNED_GPU.get().map(String::as_str)
}
