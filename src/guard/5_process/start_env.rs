//! What this process was *started* with: the `CUDA_VISIBLE_DEVICES` of its initial
//! environment, for R1's rule that a process given one GPU keeps it
//! (`crate::rankgpu::started_with`, docs/design.md §1).
//!
//! The environment block the kernel wrote at `exec`: `setenv` (Python's
//! `os.environ[...] = ...` calls it) writes new strings elsewhere and may replace the
//! pointers of `environ`, even of the loader's own `envp` array, but never this block. A
//! forked child shares it, as it shares its parent's start. Read from this process's own
//! memory where the initial stack is as the kernel laid it out
//! ([`crate::guard::sys::start_block`]), else from `/proc/self/environ`, the same bytes
//! through a file. Cold path only: read once, at the first `cuInit` (the R1 check), never
//! at load time.

use crate::guard::process::root_walk;
use crate::guard::resolve::real;
use crate::guard::sys::{signal_safe, start_block};
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
    let scan = EnvScan::cvd_only().finding_nul_with(signal_safe::first_nul);
    if let Some(block) = in_memory() {
        let bytes = block.bytes();
        // The current value, where it still lies in the block, is the block's first
        // definition: `getenv` takes the first entry of `environ`, which starts as the
        // block's entries in order, and the C library only ever replaces a definition by a
        // string of its own (`setenv`, `putenv`: outside the block) or removes every one
        // (`unsetenv`). No scan of the block then (64 KiB here took microseconds).
        if let Some(v) = signal_safe::getenv_bytes("CUDA_VISIBLE_DEVICES") {
            let (at, lo) = (v.as_ptr() as usize, bytes.as_ptr() as usize);
            if at >= lo && at + v.len() < lo + bytes.len() {
                return Ok(std::str::from_utf8(v).ok().map(str::to_string));
            }
        }
        // Else scanned in place, whole (the scan stops at the first CVD): a read of memory
        // cannot fail.
        let mut scan = scan;
        scan.feed(bytes, true);
        return Ok(scan.finish().cvd);
    }
    match root_walk::scan_environ_file("/proc/self/environ", scan, &mut Vec::new()) {
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

/// The start environment in this process's memory, when its initial stack is as the
/// kernel wrote it (`__libc_stack_end`, glibc's loader's, found with the real `dlsym`).
/// The start block in this process's memory, when its layout is still the kernel's.
fn in_memory() -> Option<start_block::Block> {
    start_block::at_load().or_else(|| {
        let stack_end = real::lookup(libc::RTLD_DEFAULT, c"__libc_stack_end");
        start_block::find(stack_end.cast_const().cast())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block read from memory is, byte for byte, what the kernel answers for
    /// /proc/self/environ (this test process was started by exec like any other).
    #[test]
    fn the_block_in_memory_is_proc_self_environ() {
        let block = in_memory().expect("the test process's initial stack is as exec wrote it");
        let mine = block.bytes();
        let proc = std::fs::read("/proc/self/environ").unwrap();
        assert!(!proc.is_empty());
        assert_eq!(mine, proc);
    }

    /// The block found from the constructor's `argv` is the one `__libc_stack_end` finds:
    /// the constructor ran in this test binary too (the library's `.init_array` entry).
    #[test]
    fn the_constructors_argv_finds_the_same_block() {
        let by_argv = start_block::at_load().expect("the constructor saw the initial argv");
        let stack_end = real::lookup(libc::RTLD_DEFAULT, c"__libc_stack_end");
        let by_symbol = start_block::find(stack_end.cast_const().cast()).unwrap();
        assert_eq!(by_argv.bytes(), by_symbol.bytes());
        assert!(!by_argv.bytes().is_empty());
    }

    /// Setting the variable changes `environ`, not what the process was started with.
    #[test]
    fn the_start_cvd_is_the_exec_ones() {
        let proc = std::fs::read("/proc/self/environ").unwrap();
        let started = proc
            .split(|&b| b == 0)
            .find_map(|e| e.strip_prefix(b"CUDA_VISIBLE_DEVICES="))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        assert_eq!(cvd().unwrap(), started);
    }
}
