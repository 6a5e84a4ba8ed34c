//! The CLI's FFI: CPU affinity, signals to process groups, synchronous signal waiting, and
//! the driver query through `libloading`. A rank's start (clone and exec) is in
//! `rank_start.rs`, the helpers' forks in `forked.rs`.
//!
//! `unsafe` is allowed in these three modules only (main.rs denies it); each block states
//! the invariant that makes it sound. Everything exported here is a safe function.

use std::ffi::{c_char, c_int, CStr};
use std::io;
use std::time::Duration;

use super::driver_api::{
    CUdevice, CUresult, CUuuid, PFN_cuDeviceGet, PFN_cuDeviceGetCount, PFN_cuDeviceGetPCIBusId,
    PFN_cuDeviceGetUuid_v2, PFN_cuGetErrorName, PFN_cuInit,
};
use super::exit::ExitCode;
use crate::cpuset::{CpuSet, MAX_CPU};

/// What the CLI needs of std's start-up, around `cli` (the dispatch, from the process's C
/// `main`, src/main.rs; `#![no_main]`):
/// - Descriptors 0-2 that are closed are opened on `/dev/null`, so a file the CLI opens can
///   never become its stdout (std's start-up does the same).
/// - SIGPIPE is ignored, as under std's start-up: a closed pipe is an error the CLI handles
///   (`emit`), never a silent death; ranks and `run`'s command get it back at its default
///   (`rank_start.rs`, std's `Command`).
/// - A panic is caught and exits 101, as std's start-up makes it.
/// - Stdout is flushed at the end (std's start-up does it at exit).
///
/// Left out: std's stack-overflow guard for the main thread, whose set-up reads
/// `/proc/self/maps` (glibc's `pthread_getattr_np`): a stack overflow is a plain SIGSEGV.
pub fn start(cli: fn() -> ExitCode) -> c_int {
    for fd in 0..3 {
        // SAFETY: fcntl(F_GETFD) and open take an integer and a NUL-terminated literal.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) == -1
                && io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
                && libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) != fd
            {
                libc::abort();
            }
        }
    }
    // SAFETY: SIG_IGN is a valid disposition for SIGPIPE; no other thread exists yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let code = std::panic::catch_unwind(cli).map_or(101, |c| c.0);
    let _ = io::Write::flush(&mut io::stdout());
    c_int::from(code)
}

/// A kernel CPU mask big enough for every id we accept (MAX_CPU), passed where libc expects
/// a `cpu_set_t` (the kernel takes any size that covers `nr_cpu_ids`).
#[derive(Clone)]
pub(super) struct Mask([u64; (MAX_CPU as usize + 1) / 64]);

impl Mask {
    pub(super) fn from_set(set: &CpuSet) -> Mask {
        let mut m = Mask([0; (MAX_CPU as usize + 1) / 64]);
        for c in set.iter() {
            m.0[(c / 64) as usize] |= 1u64 << (c % 64);
        }
        m
    }
    fn to_set(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for (w, bits) in self.0.iter().enumerate() {
            for b in 0..64 {
                if bits & (1u64 << b) != 0 {
                    s.insert((w * 64 + b) as u32);
                }
            }
        }
        s
    }
}

/// This process's CPU affinity (`sched_getaffinity(0)`).
pub fn affinity() -> io::Result<CpuSet> {
    let mut m = Mask([0; (MAX_CPU as usize + 1) / 64]);
    // SAFETY: the pointer and size describe `m`, a live, writable buffer of exactly that size;
    // the kernel writes at most `size` bytes into it.
    let rc = unsafe {
        libc::sched_getaffinity(
            0,
            std::mem::size_of::<Mask>(),
            (&mut m as *mut Mask).cast::<libc::cpu_set_t>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(m.to_set())
}

/// The version of the glibc this process runs on (`gnu_get_libc_version`), e.g. (2, 36):
/// which build of librankguard.so fits it (`lib_build.rs`).
pub fn glibc_version() -> Option<(u32, u32)> {
    // SAFETY: gnu_get_libc_version takes no arguments and returns a pointer to a static,
    // NUL-terminated string (glibc's manual); it is never NULL, checked anyway.
    let p = unsafe { libc::gnu_get_libc_version() };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated, static (above).
    let v = unsafe { CStr::from_ptr(p) };
    super::lib_build::parse_version(&v.to_string_lossy())
}

/// Whether child `pid` has ended, without blocking (`wait` false), or once it has (`wait`
/// true); reaps it. Its status as `ExitStatus`.
pub fn wait_child(pid: u32, wait: bool) -> io::Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    let flags = if wait { 0 } else { libc::WNOHANG };
    loop {
        let mut status: c_int = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, flags) };
        if rc == pid {
            return Ok(Some(std::process::ExitStatus::from_raw(status)));
        }
        if rc == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether an ELF object with the file name `name` is loaded in this process (the
/// program's libraries, preloaded or `dlopen`ed), from the loader's own list
/// (`dl_iterate_phdr`): no file to read, unlike `/proc/self/maps`.
pub fn object_loaded(name: &str) -> bool {
    any_object_loaded(|file| file == name.as_bytes())
}

/// Whether an ELF object whose file name `matches` is loaded (see [`object_loaded`]).
pub fn any_object_loaded(matches: impl Fn(&[u8]) -> bool) -> bool {
    struct Search<'a> {
        matches: &'a dyn Fn(&[u8]) -> bool,
        found: bool,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed below, alive for the whole iteration;
        // `info` is valid during the callback and `dlpi_name` is NULL or NUL-terminated.
        let (search, path) = unsafe {
            let search = &mut *data.cast::<Search>();
            let p = (*info).dlpi_name;
            if p.is_null() {
                return 0;
            }
            (search, CStr::from_ptr(p).to_bytes())
        };
        let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        search.found = (search.matches)(file);
        c_int::from(search.found)
    }
    let mut search = Search {
        matches: &matches,
        found: false,
    };
    // SAFETY: `visit` matches the callback type, never unwinds (the callers' predicates
    // compare bytes), and `search` outlives the call; a non-zero return ends the iteration.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

/// Make this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant orphaned
/// by its parent (a rank's `setsid` helper whose parent exited) becomes our child instead
/// of init's, so it can still be found, signalled and reaped.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reap exited children that are not in `keep` (orphans adopted as subreaper), without
/// touching the exit status of those in `keep` (the ranks, whose `Child` reaps them).
pub fn reap_others(keep: &[u32]) {
    loop {
        // SAFETY: siginfo_t is plain data, for which all-zero bytes are a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, exclusively borrowed out-pointer; with WNOWAIT waitid
        // only peeks at a child that has exited (its status stays for its own reaper).
        let rc = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is valid to read after waitid filled `info` (0 when none exited).
        let pid = unsafe { info.si_pid() };
        if rc != 0 || pid <= 0 || keep.contains(&(pid as u32)) {
            return;
        }
        let mut status = 0;
        // SAFETY: reaps exactly this exited child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    }
}

/// Send `sig` to one process.
pub fn signal_pid(pid: u32, sig: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    // SAFETY: kill takes integers only.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Wait up to `timeout` for `fd` to be readable (or at end of file).
pub fn wait_readable(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) > 0 }
}

/// One `read(2)` from `fd` into `buf`.
pub fn read_fd(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its full length, which is what we pass.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Send `sig` to the process group `pgid` (a rank child and its descendants).
pub fn signal_group(pgid: u32, sig: i32) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid).map_err(|_| io::Error::other("pid out of range"))?;
    // SAFETY: kill takes integers only; a negative pid addresses a process group.
    if unsafe { libc::kill(-pgid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The signals the launcher handles synchronously; blocked in every thread it creates after
/// [`Signals::block`], so they queue up for [`Signals::wait`] instead of killing it.
pub struct Signals {
    set: libc::sigset_t,
}

pub const SIGTERM: i32 = libc::SIGTERM;
pub const SIGKILL: i32 = libc::SIGKILL;
pub const SIGCHLD: i32 = libc::SIGCHLD;

impl Signals {
    /// Block SIGINT, SIGTERM, SIGHUP and SIGCHLD in the calling thread (call it before any
    /// thread is spawned) and reset SIGCHLD to its default disposition, so children are not
    /// auto-reaped behind our back if the parent left it ignored.
    pub fn block() -> io::Result<Signals> {
        // SAFETY: sigset_t is plain data; zeroed then initialised by sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; the signal numbers are valid; SIG_DFL is a
        // valid disposition for SIGCHLD.
        unsafe {
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD] {
                libc::sigaddset(&mut set, s);
            }
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        Ok(Signals { set })
    }

    /// Wait up to `timeout` for one of the blocked signals; its number, or None.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `self.set` is an initialised sigset_t, `ts` a valid timespec, and a null
        // siginfo pointer is allowed.
        let rc = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        if rc > 0 {
            Some(rc)
        } else {
            None
        }
    }
}

/// One GPU as the driver enumerates it under this process's environment.
pub struct RawGpu {
    pub uuid: [u8; 16],
    pub bus_id: String,
}

/// `CUDA_ERROR_NO_DEVICE` (cuda.h): what cuInit returns when nothing is visible.
const CUDA_ERROR_NO_DEVICE: CUresult = 100;

/// Ask the driver (`libcuda.so.1`, found like the CUDA runtime finds it, so
/// `LD_LIBRARY_PATH` selects the fake platform in tests) which GPUs this process sees.
/// Every failure is an `Err` naming the call and the driver's error name; nothing panics.
pub fn driver_gpus() -> Result<Vec<RawGpu>, String> {
    // SAFETY: loading libcuda.so.1 runs its initialisers; the driver library is designed to
    // be dlopen()ed this way by every CUDA runtime and binding.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| format!("cannot load libcuda.so.1: {e}"))?;
    // SAFETY (this `get` and each one below): the symbol is declared in cudaTypedefs.h with
    // exactly the signature of the function-pointer type it is read as (`PFN_<symbol>`,
    // generated from that header: driver_api.rs); `lib` outlives every use.
    let init: libloading::Symbol<PFN_cuInit> =
        // SAFETY: as above (cuda.h's cuInit).
        unsafe { lib.get(b"cuInit\0") }.map_err(|e| e.to_string())?;
    let count_fn: libloading::Symbol<PFN_cuDeviceGetCount> =
        // SAFETY: as above (cuda.h's cuDeviceGetCount).
        unsafe { lib.get(b"cuDeviceGetCount\0") }.map_err(|e| e.to_string())?;
    let get: libloading::Symbol<PFN_cuDeviceGet> =
        // SAFETY: as above (cuda.h's cuDeviceGet).
        unsafe { lib.get(b"cuDeviceGet\0") }.map_err(|e| e.to_string())?;
    // SAFETY: as above (cuDeviceGetUuid_v2 and its fall-back cuDeviceGetUuid: one signature,
    // checked by the generator).
    let uuid_fn: libloading::Symbol<PFN_cuDeviceGetUuid_v2> =
        unsafe { lib.get(b"cuDeviceGetUuid_v2\0") }
            // SAFETY: as above.
            .or_else(|_| unsafe { lib.get(b"cuDeviceGetUuid\0") })
            .map_err(|e| e.to_string())?;
    let bus_fn: libloading::Symbol<PFN_cuDeviceGetPCIBusId> =
        // SAFETY: as above (cuda.h's cuDeviceGetPCIBusId).
        unsafe { lib.get(b"cuDeviceGetPCIBusId\0") }.map_err(|e| e.to_string())?;
    let name_fn: Option<libloading::Symbol<PFN_cuGetErrorName>> =
        // SAFETY: as above (cuda.h's cuGetErrorName).
        unsafe { lib.get(b"cuGetErrorName\0") }.ok();
    let describe = |rc: CUresult| -> String {
        let mut p: *const c_char = std::ptr::null();
        if let Some(f) = &name_fn {
            // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string (or
            // leaves it untouched on an unknown code); we read it only when non-null.
            if unsafe { f(rc, &mut p) } == 0 && !p.is_null() {
                // SAFETY: non-null and NUL-terminated per cuda.h; static lifetime.
                let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
                return format!("{s} ({rc})");
            }
        }
        format!("CUresult {rc}")
    };

    // SAFETY: cuInit(0) is the documented first call; flags must be 0.
    let rc = unsafe { init(0) };
    if rc == CUDA_ERROR_NO_DEVICE {
        return Ok(vec![]);
    }
    if rc != 0 {
        return Err(format!("cuInit failed: {}", describe(rc)));
    }
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    let rc = unsafe { count_fn(&mut n) };
    if rc != 0 {
        return Err(format!("cuDeviceGetCount failed: {}", describe(rc)));
    }
    let mut out = Vec::new();
    for ordinal in 0..n {
        let mut dev: CUdevice = 0;
        // SAFETY: `dev` is a valid out-pointer; the ordinal is below the reported count.
        let rc = unsafe { get(&mut dev, ordinal) };
        if rc != 0 {
            return Err(format!("cuDeviceGet({ordinal}) failed: {}", describe(rc)));
        }
        let mut u = CUuuid { bytes: [0; 16] };
        // SAFETY: `u` is a valid, writable CUuuid.
        let rc = unsafe { uuid_fn(&mut u, dev) };
        if rc != 0 {
            return Err(format!(
                "cuDeviceGetUuid({ordinal}) failed: {}",
                describe(rc)
            ));
        }
        // cuda.h: "len: Maximum length of string to store in name", 13 chars + NUL for the
        // documented `domain:bus:device.function` form; 64 leaves room for any spelling.
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` is writable for its full length, which is what we pass.
        let rc = unsafe { bus_fn(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        if rc != 0 {
            return Err(format!(
                "cuDeviceGetPCIBusId({ordinal}) failed: {}",
                describe(rc)
            ));
        }
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (last byte forced to 0 above).
        let bus_id = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        out.push(RawGpu {
            uuid: u.bytes,
            bus_id,
        });
    }
    Ok(out)
}

/// `rankguard doctor`'s child (`__doctor-probe`): `cuInit(0)` then `cuDeviceGet(&d, 1)`,
/// an ordinal other than 0 (R2), through `dlsym` as every CUDA binding calls the driver.
/// Returns the two results; Err when the driver cannot be loaded.
pub fn probe_r2() -> Result<(CUresult, CUresult), String> {
    // SAFETY: as in `driver_gpus`: libcuda.so.1 is designed to be dlopen()ed.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| format!("cannot load libcuda.so.1: {e}"))?;
    let init: libloading::Symbol<PFN_cuInit> =
        // SAFETY: cuda.h's cuInit has exactly this signature; `lib` outlives its use.
        unsafe { lib.get(b"cuInit\0") }.map_err(|e| e.to_string())?;
    let get: libloading::Symbol<PFN_cuDeviceGet> =
        // SAFETY: cuda.h's cuDeviceGet has exactly this signature; `lib` outlives its use.
        unsafe { lib.get(b"cuDeviceGet\0") }.map_err(|e| e.to_string())?;
    // SAFETY: cuInit(0) is the documented first call; flags must be 0.
    let rc_init = unsafe { init(0) };
    let mut dev: CUdevice = 0;
    // SAFETY: `dev` is a valid out-pointer; the driver checks the ordinal.
    let rc_get = unsafe { get(&mut dev, 1) };
    Ok((rc_init, rc_get))
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The home directory of `uid` from the user database (as the guard finds it for the
/// registry's private fallback), when it is an absolute path.
pub fn home_dir(uid: u32) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data (integers and pointers): all-zero is a valid value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into `pw` and into `buf` (whose length we pass) and sets
    // `result` to `&pw` or to NULL.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: on success pw_dir points to a NUL-terminated string inside `buf`.
    let dir = unsafe { CStr::from_ptr(pw.pw_dir) };
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()));
    path.is_absolute().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_loaded_finds_libc_by_file_name_only() {
        assert!(object_loaded("libc.so.6"));
        assert!(!object_loaded("librankguard-test-not-loaded.so"));
        assert!(!object_loaded("libc.so")); // a whole file name, not a prefix
        assert!(!object_loaded("/lib/x86_64-linux-gnu/libc.so.6")); // not a path
    }
}
