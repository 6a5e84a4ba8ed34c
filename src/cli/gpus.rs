//! Asking the driver which GPUs this environment makes visible.
//!
//! The query runs in a helper process rather than in the CLI:
//!   - the guard may be in the CLI's own `LD_PRELOAD` (`rankguard check` inside a rank, a
//!     launcher started under the guard); a process that initialises CUDA with several GPUs
//!     visible is what the guard terminates, so the helper runs with the guard removed from
//!     `LD_PRELOAD` and `RANKGUARD_MODE=off`;
//!   - `check` compares identities by running the helper under a different
//!     `CUDA_VISIBLE_DEVICES`, which a process cannot change for itself after cuInit;
//!   - the launcher never initialises CUDA before forking its ranks.
//!
//! The driver is found as `libcuda.so.1` on the normal search path, exactly as the CUDA
//! runtime finds it, so the fake platform on `LD_LIBRARY_PATH` is honoured in tests.
//!
//! The helper is a `fork` of the CLI that asks the driver and `_exit`s (`forked.rs`: no
//! `exec`, no loader, so it costs a fraction of one rank's start; `launch` asks once per
//! launch, whatever the number of ranks). Where that is not possible (the CLI has the
//! guard loaded (`sys::object_loaded`), i.e. it runs under it; or more than one thread) it is an `exec` of
//! `rankguard __driver-query` with the guard removed from `LD_PRELOAD`, as before. Both
//! speak the same lines (`gpu<TAB>uuid<TAB>bus id`, or the error on stderr).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::process::Command;

use super::exit::{Error, ExitCode, Result};
use super::{env, sys};
use crate::cvd::{self, CvdEntry, Visibility};
use crate::plan::DriverGpu;
use rankguard_core::uuid::{uuid_text, UuidKind};

/// The last line of a whole answer: a reader that has it need not wait for the helper's
/// exit, which after `cuInit` includes the driver's own teardown (its device files closed,
/// its mappings undone).
const END: &str = "end\n";

/// The hidden subcommand the CLI runs itself as to ask the driver ([`helper_main`]).
pub const DRIVER_QUERY: &str = "__driver-query";

/// The helper's answer: one `gpu<TAB>uuid<TAB>bus id` line per device then [`END`], or the
/// error.
fn answer() -> std::result::Result<String, String> {
    let gpus = sys::driver_gpus()?;
    let mut out: String = gpus
        .iter()
        .map(|g| {
            format!(
                "gpu\t{}\t{}\n",
                uuid_text(UuidKind::Gpu, &g.uuid),
                g.bus_id.trim()
            )
        })
        .collect();
    out.push_str(END);
    Ok(out)
}

/// The hidden `__driver-query` subcommand (the exec'ed helper).
pub fn helper_main(_args: Vec<OsString>) -> Result<ExitCode> {
    match answer() {
        Ok(lines) => {
            print!("{lines}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(Error { msg: e, code: 1 }),
    }
}

/// The helper forked (see the module doc), still running: the read end of its stdout and
/// the child. None when a forked helper cannot be used here.
fn start_forked(
    cvd_override: Option<Option<&str>>,
) -> Option<(std::io::PipeReader, super::forked::Child)> {
    use std::io::Write;
    if sys::object_loaded(super::env::GUARD_FILE) {
        return None;
    }
    let (out_r, out_w) = std::io::pipe().ok()?;
    let setup = super::forked::Setup {
        stdin: None,
        stdout: Some(out_w.into()),
        own_group: false,
    };
    let child = super::forked::spawn(setup, move || {
        match cvd_override {
            None => {}
            Some(Some(v)) => std::env::set_var(cvd::VAR, v),
            Some(None) => std::env::remove_var(cvd::VAR),
        }
        // One write to fd 1 itself: Rust's Stdout buffer is a copy of the parent's.
        let (text, code) = match answer() {
            Ok(lines) => (lines, 0),
            Err(e) => (format!("error\t{}\n", e.replace('\n', " ")), 1),
        };
        let written = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .and_then(|fd| std::fs::File::from(fd).write_all(text.as_bytes()));
        if written.is_ok() {
            code
        } else {
            1
        }
    })
    .ok()?;
    Some((out_r, child))
}

/// Whether the helper's exit is waited for once its answer is whole.
pub enum Reap<'a> {
    /// Wait for it (its status is not needed): nothing else will (`check`, `plan`, `run`,
    /// which then execs its command and must not hand it a child it never started).
    Now,
    /// Leave it exiting, its exit off the critical path (docs/benchmarks.md, figure 4), and
    /// put it here for the caller to wait for later. `launch` does before it looks for
    /// leftovers: what the helper left running is then already the launcher's child, never
    /// a process being re-parented that one scan of the process tree can miss.
    Later(&'a mut Option<super::forked::Child>),
}

/// The forked helper's answer: once it is whole ([`END`]), not at the end of its output,
/// which whatever the driver started could keep open; or, without [`END`], the helper's
/// error once it has exited.
fn finish_forked(
    mut out_r: std::io::PipeReader,
    child: super::forked::Child,
    reap: Reap<'_>,
) -> std::result::Result<String, String> {
    use std::io::Read;
    let mut buf = Vec::new();
    let read = loop {
        let mut chunk = [0u8; 4096];
        match out_r.read(&mut chunk) {
            Ok(0) => break Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
        if buf.ends_with(END.as_bytes()) {
            match reap {
                Reap::Now => {
                    let _ = child.wait();
                }
                Reap::Later(slot) => *slot = Some(child),
            }
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
    };
    let out = String::from_utf8_lossy(&buf).into_owned();
    let status = child.wait();
    let error = out
        .lines()
        .find_map(|l| l.strip_prefix("error\t"))
        .map(str::to_string);
    match (read, status, error) {
        (Ok(_), Ok(0), None) => Ok(out),
        (Ok(_), Ok(_), Some(e)) => Err(e),
        (Ok(_), Ok(s), None) => Err(format!("the driver query helper failed (status {s})")),
        (Err(e), _, _) | (_, Err(e), _) => Err(format!("the driver query helper: {e}")),
    }
}

/// A driver query under way ([`start`]): the forked helper asks the driver while the
/// caller does other work (`launch` resolves its environment and starts its reaper
/// meanwhile); [`Pending::finish`] collects the answer.
pub struct Pending {
    cvd_override: Option<Option<String>>,
    forked: Option<(std::io::PipeReader, super::forked::Child)>,
}

/// Start asking the driver which GPUs it enumerates. `cvd`: None = this process's own
/// `CUDA_VISIBLE_DEVICES`; Some(None) = unset; Some(Some(v)) = as if it were `v`. Where a
/// forked helper cannot be used, the exec'ed one runs in [`Pending::finish`].
pub fn start(cvd_override: Option<Option<&str>>) -> Pending {
    Pending {
        forked: start_forked(cvd_override),
        cvd_override: cvd_override.map(|v| v.map(str::to_string)),
    }
}

/// What the driver enumerates, in ordinal order (see [`start`]).
pub fn query(cvd_override: Option<Option<&str>>) -> std::result::Result<Vec<DriverGpu>, String> {
    start(cvd_override).finish(Reap::Now)
}

impl Pending {
    /// The answer: what the driver enumerates, in ordinal order.
    pub fn finish(self, reap: Reap<'_>) -> std::result::Result<Vec<DriverGpu>, String> {
        let cvd_override = self.cvd_override.as_ref().map(|v| v.as_deref());
        let stdout = match self.forked {
            Some((out_r, child)) => finish_forked(out_r, child, reap)?,
            None => query_exec(cvd_override)?,
        };
        Ok(parse_answer(cvd_override, &stdout))
    }
}

/// The helper's lines as `DriverGpu`s.
fn parse_answer(cvd_override: Option<Option<&str>>, stdout: &str) -> Vec<DriverGpu> {
    let effective: Option<String> = match cvd_override {
        None => std::env::var(cvd::VAR).ok(),
        Some(v) => v.map(str::to_string),
    };
    // Under a MIG-mode CVD the driver enumerates MIG instances and cuDeviceGetUuid_v2 gives
    // their UUIDs, which nvidia-smi spells `MIG-...`.
    let mig = matches!(cvd::parse(effective.as_deref()), Visibility::Entries(e) if matches!(e.first(), Some(CvdEntry::Mig(_))));
    let mut gpus = Vec::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() == 3 && f[0] == "gpu" {
            let uuid = if mig {
                f[1].replacen("GPU-", "MIG-", 1)
            } else {
                f[1].to_string()
            };
            let bus = crate::topology::normalize_bus_id(f[2]).unwrap_or_else(|| f[2].to_string());
            gpus.push(DriverGpu { uuid, bus_id: bus });
        }
    }
    gpus
}

/// The exec'ed helper, `rankguard __driver-query` without the guard: its stdout.
fn query_exec(cvd_override: Option<Option<&str>>) -> std::result::Result<String, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the rankguard executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg(DRIVER_QUERY);
    match env::preload_without_guard(std::env::var_os("LD_PRELOAD").as_deref()) {
        Some(p) => cmd.env("LD_PRELOAD", p),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    cmd.env("RANKGUARD_MODE", "off");
    match cvd_override {
        None => {}
        Some(Some(v)) => {
            cmd.env(cvd::VAR, v);
        }
        Some(None) => {
            cmd.env_remove(cvd::VAR);
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run the driver query helper: {e}"))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        let msg = msg.trim().trim_start_matches("rankguard: error: ");
        return Err(if msg.is_empty() {
            format!("the driver query helper failed ({})", out.status)
        } else {
            msg.to_string()
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
