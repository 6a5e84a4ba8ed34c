//! What this process was *started* with: the `CUDA_VISIBLE_DEVICES` of its initial
//! environment, for R1's rule that a process given one GPU keeps it
//! (`crate::rankgpu::started_with`, docs/design.md §1).
//!
//! Read from `/proc/self/environ`, the environment block the kernel wrote at `exec`: `setenv`
//! (Python's `os.environ[...] = ...` calls it) writes new strings elsewhere and may replace
//! the pointers of `environ`, even of the loader's own `envp` array, but never this block.
//! A forked child shares it, as it shares its parent's start. Cold path only: read once, at
//! the first `cuInit` (the R1 check), never at load time.

use crate::guard::process::root_walk;
use crate::guard::sys::signal_safe;
use crate::policy::Unreadable;
use crate::rank_root::EnvScan;

/// `CUDA_VISIBLE_DEVICES` as this process was started with it (None: unset, or not UTF-8);
/// Err when `/proc/self/environ` could not be read for lack of resources (the R1 check
/// fails closed then, as for the rank root's walk). Gone or forbidden (a `/proc` mounted
/// with `hidepid`) reads as "started with no CVD". Read as the walk reads an ancestor's (a
/// first read of one page, then 32 KiB pieces), and only up to the first definition (the
/// one `getenv` returns), at most 8 MiB (ARG_MAX-sized environments fit): the rest cannot
/// change it.
pub fn cvd() -> Result<Option<String>, Unreadable> {
    let mut buf = Vec::new();
    match root_walk::scan_environ_file("/proc/self/environ", EnvScan::cvd_only(), &mut buf) {
        Ok(facts) => Ok(facts.cvd),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(0);
            if [libc::ENOENT, libc::ESRCH, libc::EACCES, libc::EPERM].contains(&errno) {
                Ok(None)
            } else {
                Err(Unreadable {
                    pid: signal_safe::pid(),
                    file: "environ",
                    errno,
                })
            }
        }
    }
}
