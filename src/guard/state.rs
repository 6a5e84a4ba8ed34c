//! Per-process state: the configuration (read at the first guarded call, never in a
//! constructor), the audit and debug sinks, and the identity the R1 check established.
//!
//! All of it lives in `OnceCell`s: set once, read lock-free afterwards. Nothing depends on
//! the pid (reports call getpid each time), so a forked child needs no reset: it inherits a
//! finished state, and its reports carry its own pid.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use once_cell::sync::OnceCell;

use crate::config::{self, Config, Level, Mode};
use crate::guard::report::{self, StackBuf};

pub struct State {
    pub config: Config,
    /// Audit file descriptor (O_APPEND), or -1.
    pub audit_fd: i32,
    /// True in secure-execution (setuid/setgid) processes: the guard stays inert there,
    /// since it must not act on an environment an unprivileged user controls.
    pub inert: bool,
}

static STATE: OnceCell<State> = OnceCell::new();

/// The identity of this process's one GPU, once R1 was checked.
static OWNED_GPU: OnceCell<String> = OnceCell::new();

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
    STATE.get_or_init(|| {
        // SAFETY: getauxval has no preconditions; AT_SECURE is set by the kernel for
        // setuid/setgid/capability-raising executions.
        let inert = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
        let config = Config::from_lookup(|k| {
            let key = CString::new(k).ok()?;
            report::getenv(&key).map(str::to_string)
        });
        let mut host = [0u8; 64];
        let host = report::hostname(&mut host).to_string();
        let audit_fd = match &config.audit {
            Some(t) if !inert => open_append(&config::expand_path(t, &host, report::pid())),
            _ => -1,
        };
        let state = State { config, audit_fd, inert };
        if !inert {
            init_debug(&state.config, &host);
        }
        state
    })
}

fn open_append(path: &str) -> i32 {
    let Ok(c) = CString::new(path) else {
        warn_once_config("RANKGUARD_AUDIT", path, "contains a NUL byte");
        return -1;
    };
    // SAFETY: `c` is NUL-terminated; the flags ask for an append-only descriptor that is
    // not inherited across exec (children open their own).
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        warn_once_config("RANKGUARD_AUDIT", path, "cannot be opened for appending; no audit records will be written");
    }
    fd
}

static CONFIG_WARNED: AtomicBool = AtomicBool::new(false);

/// A configuration problem, said on stderr.
fn warn_once_config(var: &str, value: &str, what: &str) {
    let mut b = StackBuf::<768>::new();
    engine::prefix(&mut b, "WARN");
    let _ = std::fmt::Write::write_fmt(&mut b, format_args!("{var}={value:?} {what}\n"));
    report::write_all(2, b.as_bytes());
}

/// Say each invalid configuration value once per process.
pub fn report_config_errors() {
    // A load first: the violation path calls this each time, a swap would be a locked write.
    if CONFIG_WARNED.load(Ordering::Relaxed) || CONFIG_WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    for e in &get().config.errors {
        warn_once_config(e.var, &e.value, &format!("is not valid: expected {}", e.expected));
    }
}

fn init_debug(cfg: &Config, host: &str) {
    let Some(level) = cfg.debug else { return };
    let max = match level {
        Level::Warn => tracing::Level::WARN,
        Level::Info => tracing::Level::INFO,
        Level::Debug => tracing::Level::DEBUG,
        Level::Trace => tracing::Level::TRACE,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(max)
        .with_target(false)
        .with_ansi(false)
        .with_thread_ids(true);
    // The subscriber lives in this library's own copy of `tracing`: the host process's
    // logging (Rust or not) is untouched.
    let result = match &cfg.debug_file {
        Some(t) => {
            let path = config::expand_path(t, host, report::pid());
            match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
                Ok(f) => tracing::subscriber::set_global_default(
                    builder.with_writer(std::sync::Mutex::new(f)).finish(),
                ),
                Err(_) => {
                    warn_once_config("RANKGUARD_DEBUG_FILE", &path, "cannot be opened; debug log goes to stderr");
                    tracing::subscriber::set_global_default(builder.with_writer(std::io::stderr).finish())
                }
            }
        }
        None => tracing::subscriber::set_global_default(builder.with_writer(std::io::stderr).finish()),
    };
    let _ = result;
}

/// Remember the identity of the process's GPU (set once by the R1 check).
pub fn set_owned_gpu(uuid: String) {
    let _ = OWNED_GPU.set(uuid);
}

pub fn owned_gpu() -> Option<&'static str> {
    OWNED_GPU.get().map(String::as_str)
}

use crate::guard::engine;
