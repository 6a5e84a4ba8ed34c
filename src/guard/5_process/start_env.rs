//! What this process was *started* with: the `CUDA_VISIBLE_DEVICES` of its initial
//! environment, for R1's rule that a process given one GPU keeps it
//! (`crate::rankgpu::started_with`, docs/design.md §1).
//!
//! Read from `/proc/self/environ`, the environment block the kernel wrote at `exec`: `setenv`
//! (Python's `os.environ[...] = ...` calls it) writes new strings elsewhere and may replace
//! the pointers of `environ`, even of the loader's own `envp` array, but never this block.
//! A forked child shares it, as it shares its parent's start. Cold path only: read once, at
//! the first `cuInit` (the R1 check), never at load time.

use std::fs::File;
use std::io::Read;

use crate::guard::sys::signal_safe;
use crate::policy::Unreadable;
use crate::rank_root;

/// Largest environment read (ARG_MAX-sized environments fit).
const MAX_ENVIRON: u64 = 8 << 20;

/// `CUDA_VISIBLE_DEVICES` as this process was started with it (None: unset, or not UTF-8);
/// Err when `/proc/self/environ` could not be read for lack of resources (the R1 check
/// fails closed then, as for the rank root's walk). Gone or forbidden (a `/proc` mounted
/// with `hidepid`) reads as "started with no CVD".
pub fn cvd() -> Result<Option<String>, Unreadable> {
    let mut buf = Vec::new();
    let read =
        File::open("/proc/self/environ").and_then(|f| f.take(MAX_ENVIRON).read_to_end(&mut buf));
    match read {
        Ok(_) => Ok(rank_root::scan_environ(&buf).cvd),
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
