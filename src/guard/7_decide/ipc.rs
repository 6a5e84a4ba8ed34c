//! R3 glue: what the IPC wrappers of `wrappers.rs` call around the real export and import
//! functions. It asks the driver and the kernel for the facts (handle bytes, file identity
//! of a shared fd, the memory's device and location) and hands them to the safe
//! [`crate::registry`], which keeps the provenance records and decides.
//!
//! Rules of this module:
//! - nothing here may crash the host process: registry work runs under `catch_unwind`, and
//!   any registry problem is said once on stderr and turns into "provenance unknown"
//!   (refused when the default directory is taken and there is no private fallback);
//! - no locks (a forked child must never find one held): the registry directory is
//!   re-verified on every use, and "said once" flags are atomics;
//! - the runtime's IPC functions reach the driver's through our own driver wrappers (the
//!   runtime gets its driver entry points from `cuGetProcAddress`), so a runtime wrapper
//!   marks its thread while it runs ([`RuntimeScope`]) and the nested driver wrapper
//!   neither checks nor records a second time.
//!
//! Decided here, where the docs are silent (README contract table lists them):
//! - a denied import returns `CUDA_ERROR_NOT_PERMITTED`/`cudaErrorNotPermitted` (800);
//! - after-the-fact verification uses `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` of an opened
//!   legacy/pool pointer (cuda.h: "a device ordinal of a device against which the memory
//!   was allocated") and only the location *type* of an imported VMM allocation: its
//!   `location.id` may be the exporter's numbering (fake driver D-importprop), so it is
//!   never taken as provenance;
//! - pool exports record the current context's GPU with location "unknown" (no driver
//!   call reports a pool's location).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::config::Mode;
use crate::guard::audit::decision_record::Extra;
use crate::guard::decide::verdict::{self, Code};
use crate::guard::decide::{event_records, own_records};
use crate::guard::output::debug_log;
use crate::guard::process::registry_io::{
    self, open_registry, open_registry_in, open_registry_or_why, said_write_problem, say_once,
    Untrusted, SAID_WRITE,
};
use crate::guard::process::root_walk;
use crate::guard::process::state;
use crate::guard::resolve::internal;
use crate::guard::sys::ffi::{
    CUdevice, CUevent, CUmemAllocationPropHead, CUmemLocation, CuResult,
    ExternalMemoryHandleDescHead, EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
};
use crate::guard::sys::lifecycle::PerProcess;
use crate::guard::sys::signal_safe;
use crate::handle_table;
use crate::handle_table::Handle;
use crate::policy::{DenyCode, Detail, Rule, Verdict, Violation};
use crate::registry::{
    self, table_handle, Decision, FileIdent, Importer, Key, Kind, Location, Lookup, Now, ProcFs,
    ProcInfo, Procs, ProvenanceRecord, WriteProblem,
};
use rankguard_core::record::{Exporter, RootRef, RuleFields};
use std::borrow::Cow;

/// Every 64-byte opaque CUDA handle: `CUipcMemHandle`, `CUipcEventHandle`, their runtime
/// twins `cudaIpcMemHandle_t`/`cudaIpcEventHandle_t`, `CUmemFabricHandle` and
/// `CUmemPoolPtrExportData` (cuda.h: `char reserved[CU_IPC_HANDLE_SIZE]`, 64). Passed by
/// value to the open functions; never parsed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    pub reserved: [u8; 64],
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (the shareable handle is an `int`).
pub const HANDLE_TYPE_POSIX_FD: u32 = 0x1;
/// `CU_MEM_HANDLE_TYPE_FABRIC` (the shareable handle is a `CUmemFabricHandle`).
pub const HANDLE_TYPE_FABRIC: u32 = 0x8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;

/// Room for a whole `CUmemAllocationProp` (32 bytes in cuda.h 12.9) with margin: the driver
/// writes the full struct, the guard reads only its head.
#[repr(C, align(8))]
struct AllocProp {
    head: CUmemAllocationPropHead,
    rest: [u8; 48],
}

// ---------------------------------------------------------------------------------------
// Runtime nesting

thread_local! {
    static IN_RUNTIME: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread while a runtime wrapper that judged its call already (the IPC
/// wrappers, and `cudaMemPoolSetAccess` for R4) runs the real runtime function.
pub struct RuntimeScope(bool);

impl RuntimeScope {
    pub fn enter() -> RuntimeScope {
        RuntimeScope(IN_RUNTIME.replace(true))
    }
}

impl Drop for RuntimeScope {
    fn drop(&mut self) {
        IN_RUNTIME.set(self.0);
    }
}

/// Whether this thread is inside a runtime wrapper that has judged its call already (a
/// nested driver wrapper then neither checks nor records it a second time).
pub fn in_runtime() -> bool {
    IN_RUNTIME.get()
}

/// Whether the guard acts at all on this call (mode not off, not nested in a runtime
/// wrapper that already did).
fn active() -> bool {
    state::mode() != Mode::Off && !in_runtime()
}

// ---------------------------------------------------------------------------------------
// Facts from the driver

/// The ordinal of the device a pointer's memory belongs to, as the driver reports it.
pub fn pointer_device(ptr: u64) -> Option<i32> {
    let f = internal::cuPointerGetAttribute()?;
    let mut ordinal: c_int = -1;
    // SAFETY: DEVICE_ORDINAL writes one int into the valid out-pointer.
    let rc = unsafe {
        f(
            (&raw mut ordinal).cast(),
            POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    (rc == CuResult::SUCCESS && ordinal >= 0).then_some(ordinal)
}

/// The location `(type, id)` of a VMM allocation.
fn allocation_location(handle: u64) -> Option<CUmemLocation> {
    let f = internal::cuMemGetAllocationPropertiesFromHandle()?;
    let mut prop = AllocProp {
        head: CUmemAllocationPropHead {
            type_: 0,
            requestedHandleTypes: 0,
            location: CUmemLocation { type_: 0, id: 0 },
        },
        rest: [0; 48],
    };
    // SAFETY: `prop` is larger than and aligned like CUmemAllocationProp.
    (unsafe { f((&raw mut prop).cast(), handle) } == CuResult::SUCCESS)
        .then_some(prop.head.location)
}

/// The device of the current context.
fn current_device() -> Option<i32> {
    let f = internal::cuCtxGetDevice()?;
    let mut d: CUdevice = -1;
    // SAFETY: valid out-pointer.
    (unsafe { f(&mut d) } == CuResult::SUCCESS && d >= 0).then_some(d)
}

use crate::guard::process::driver_query::device_uuid;

/// This process's GPU: what the R1 check established, else device 0's.
fn own_gpu() -> Option<String> {
    state::owned_gpu()
        .map(str::to_string)
        .or_else(|| device_uuid(0))
}

/// `(st_dev, st_ino, S_ISREG, f_type)` of an open file descriptor.
fn file_ident(fd: c_int) -> Option<FileIdent> {
    if fd < 0 {
        return None;
    }
    // SAFETY: plain-data structs, valid when zeroed; fstat/fstatfs write into them and
    // fail cleanly (EBADF) on a bad descriptor.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let mut sfs: libc::statfs = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 || libc::fstatfs(fd, &mut sfs) != 0 {
            return None;
        }
        Some(FileIdent {
            dev: st.st_dev,
            ino: st.st_ino,
            regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
            fs_magic: sfs.f_type,
        })
    }
}

/// The key of a shareable handle, by its type; None for types without a unique identity.
///
/// # Safety
/// For a POSIX fd, `os_handle` is the descriptor's value (import) — `by_value` — or points
/// to an `int` (export); for FABRIC it is NULL or points to 64 readable bytes.
unsafe fn shareable_key(
    fd_kind: Kind,
    fabric_kind: Kind,
    os_handle: *const c_void,
    htype: u32,
    by_value: bool,
) -> Option<Key> {
    match htype {
        HANDLE_TYPE_POSIX_FD => {
            let fd = if by_value {
                os_handle as usize as c_int
            } else if os_handle.is_null() {
                return None;
            } else {
                // SAFETY: caller guarantees `os_handle` points to the exported int.
                unsafe { *(os_handle as *const c_int) }
            };
            match Key::from_file(fd_kind, file_ident(fd)?) {
                Ok(k) => Some(k),
                Err(_) => {
                    debug_log::log!(
                        Debug,
                        "shared fd has no unique file identity: provenance unknown fd={fd}"
                    );
                    None
                }
            }
        }
        HANDLE_TYPE_FABRIC if !os_handle.is_null() => {
            // SAFETY: caller guarantees 64 readable bytes.
            let h = unsafe { *(os_handle as *const IpcHandle) };
            Some(Key::from_bytes(fabric_kind, &h.reserved))
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// The registry, as this process sees it

static SAID_SKIP: PerProcess = PerProcess::new();
static SAID_PANIC: PerProcess = PerProcess::new();
/// Whether this process swept the registry at its first export (a forked child sweeps again).
static SWEPT: PerProcess = PerProcess::new();

/// Whether this user has no registry it can trust because the default one is taken (see
/// [`Untrusted::DefaultTaken`]). A panic counts as "no" (said once by `shielded`).
fn default_registry_taken() -> bool {
    shielded("opening", || {
        Some(matches!(
            open_registry_or_why(),
            Err(Untrusted::DefaultTaken)
        ))
    })
    .unwrap_or(false)
}

static SAID_OVERFLOW: PerProcess = PerProcess::new();

/// Whether the registry has lost records of a live exporter (its overflow mark,
/// [`registry::Registry::overflow`]); said once per process with the mark's path. Asked
/// only for an import of unknown provenance inside a rank. A panic counts as "no".
fn registry_overflowed() -> bool {
    shielded("reading", || {
        let reg = open_registry()?;
        let o = reg.overflow(&ProcFs)?;
        say_once(
            &SAID_OVERFLOW,
            format_args!(
                "IPC provenance registry {:?} has lost records ({}; it holds at most {} records): imports of unknown provenance inside a rank break R3 (refused in enforce mode, recorded in warn mode){}. Fix: fewer live IPC exports per node, free space in its file system, or set RANKGUARD_REGISTRY to a directory with room",
                reg.dir().display().to_string(),
                match o.pid {
                    Some(pid) => format!("exporter pid {pid} could not record its exports"),
                    None => "more exporters than its overflow mark lists".to_string(),
                },
                registry::MAX_RECORDS,
                if o.sticky {
                    format!(" until {:?} is removed", o.path.display().to_string())
                } else {
                    " while that exporter lives".to_string()
                }
            ),
        );
        Some(())
    })
    .is_some()
}

/// Run registry work without letting a panic reach the host process.
fn shielded<T>(what: &str, f: impl FnOnce() -> Option<T>) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            say_once(
                &SAID_PANIC,
                format_args!("internal error while {what} the IPC provenance registry; provenance is unknown for this call (please report this)"),
            );
            None
        }
    }
}

/// This process's start time, read once per process (PyTorch exports at every share of a
/// tensor), for this pid only: a forked child reads its own. The rank root's cache, which
/// the walk and the rank record read too.
fn own_start(pid: u32) -> Option<u64> {
    root_walk::start_of(pid)
}

/// The real `/proc`, as process `me` sees it now: a look-up reuses a liveness verdict this
/// process reached in the last 5 ms (`registry::RecentlyAlive`, which says why that is safe).
struct ProcNow {
    me: u32,
}

impl Procs for ProcNow {
    fn info(&self, pid: u32) -> Option<ProcInfo> {
        ProcFs.info(pid)
    }

    fn now(&self) -> Option<Now> {
        Some(Now {
            me: self.me,
            us: signal_safe::monotonic_us(),
        })
    }
}

/// Whether process `pid` has its record of `handle` in the handle table already, as this
/// process image mapped it (no system call). PyTorch exports a segment's memory handle at
/// every share of a tensor in it: the same bytes, the same record but for its time, which
/// says when it was first written, so it stays as it is.
fn recorded_already(handle: &Handle, pid: u32) -> bool {
    registry_io::mapped_handle_table().is_some_and(|t| t.own(handle, pid).is_some())
}

/// Register an export in the provenance registry (its record). Never fails the export: a
/// problem is said once. `fresh`: this process has not recorded this key before (its name
/// is not probed first, `Registry::write_fresh`). A 64-byte handle's record goes to the
/// handle table when it has room, else to a file.
fn register_export(key: Key, gpu: Option<String>, location: Location, fresh: bool) {
    let _ = shielded("writing", || {
        // Asked once, passed down (the open's start-up sweep, this export's sweep, the
        // record, its temporary file).
        let pid = signal_safe::pid();
        let handle = key.table_handle();
        // A 64-byte handle's record, in a process that mapped the handle table and swept
        // the registry already, goes into the table with no look at the directory: its
        // slots are reached through the mapping, not the directory's path.
        let mapped = handle
            .and_then(|_| registry_io::mapped_handle_table())
            .filter(|_| SWEPT.done_in(pid));
        let reg = match mapped {
            Some(_) => None,
            None => Some(open_registry_in(pid)?),
        };
        if let Some(reg) = reg.as_ref().filter(|_| SWEPT.first_in(pid)) {
            let swept = reg.sweep(&ProcFs, registry::SWEEP_BUDGET);
            debug_log::log!(
                Debug,
                "swept the IPC provenance registry: {} stale record{} removed, {} kept{}",
                swept.removed,
                if swept.removed == 1 { "" } else { "s" },
                swept.kept,
                if swept.complete {
                    ""
                } else {
                    " (stopped at its budget before the end)"
                }
            );
        }
        let cfg = &state::get().config;
        let Some(start) = own_start(pid) else {
            say_once(&SAID_WRITE, format_args!("cannot read /proc/self/stat: IPC exports of this process are not recorded; importers will see unknown provenance"));
            return None;
        };
        let rec = ProvenanceRecord {
            key,
            job: cfg.job.as_deref().map(registry::job_token),
            rank: cfg.rank,
            pid,
            start,
            gpu,
            location,
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            root: root_walk::id(),
        };
        // A 64-byte handle's record goes to the handle table when it has room (PyTorch
        // exports a new event and its segment's memory handle per share: a slot filled in
        // place, not a file created and renamed).
        if let Some(handle) = handle {
            let table = mapped.or_else(|| {
                reg.as_ref()
                    .and_then(|r| registry_io::handle_table(r, true))
            });
            if let Some(table) = table {
                if !fresh && table.own(&handle, pid).is_some() {
                    return Some(());
                }
                if let Some(at) = table.insert(
                    &handle,
                    rec.render().as_bytes(),
                    pid,
                    &registry_io::process_exists,
                ) {
                    own_records::remember_slot(at);
                    debug_log::log!(
                        Debug,
                        "recorded IPC export {} on {} in the handle table (slot {at})",
                        rec.key.short(),
                        rec.gpu.as_deref().unwrap_or("an unknown GPU")
                    );
                    return Some(());
                }
            }
        }
        let reg = match reg {
            Some(r) => r,
            None => open_registry_in(pid)?,
        };
        let procs = ProcNow { me: pid };
        let written = if fresh {
            reg.write_fresh(&rec, &procs)
        } else {
            reg.write(&rec, &procs)
        };
        match written {
            Ok(()) => {
                // It goes when this process ends (no room: at a sweep after).
                let _ = own_records::remember(reg.dir(), pid, &rec.key);
                debug_log::log!(
                    Debug,
                    "recorded IPC export {} on {} ({} memory)",
                    rec.key.short(),
                    rec.gpu.as_deref().unwrap_or("an unknown GPU"),
                    rec.location.as_str()
                )
            }
            Err(problem) => {
                // The record is lost: mark the registry, so that importers inside a rank
                // refuse unknown provenance while this process lives (`check_import`).
                let marked = match problem {
                    WriteProblem::Full(_) | WriteProblem::Io(_) => {
                        Some(reg.mark_overflow(pid, start, &ProcFs).is_ok())
                    }
                    WriteProblem::Dir(_) | WriteProblem::TooLarge => None,
                };
                said_write_problem(
                    reg.dir(),
                    &problem,
                    match marked {
                        Some(true) => "exports of this process are not recorded; while it lives, importers inside a rank refuse imports of unknown provenance (overflow mark), others see unknown provenance",
                        Some(false) => "exports of this process are not recorded, and the registry's overflow mark could not be written either, so importers will see unknown provenance",
                        None => "exports of this process are not recorded, so importers will see unknown provenance",
                    },
                );
            }
        }
        Some(())
    });
}

/// The trusted record of `key`, if any (problems said once). A 64-byte handle's is looked
/// for in the handle table first, then as a file.
fn lookup(key: &Key) -> Option<ProvenanceRecord> {
    shielded("reading", || {
        let pid = signal_safe::pid();
        let procs = ProcNow { me: pid };
        // The handle table as this process image mapped it is read with no look at the
        // directory (its slots are reached through the mapping, not the directory's path);
        // the first look-up maps it from the verified directory, if an exporter created it.
        let mut reg = None;
        let in_table = key.table_handle().and_then(|h| {
            let table = match registry_io::mapped_handle_table() {
                Some(t) => t,
                None => registry_io::handle_table(reg.insert(open_registry_in(pid)?), false)?,
            };
            let found = table.find(&h)?;
            let verdict = registry::trust_table_text(
                found.text(),
                key,
                found.owner,
                signal_safe::euid(),
                &procs,
            );
            if matches!(verdict, Lookup::Skipped(_)) {
                // Not trusted (its exporter gone, or not the process it names): its slot
                // is emptied, as a file's record is removed.
                table.discard(&found);
            }
            Some(verdict)
        });
        let (verdict, place) = match in_table {
            Some(v) => (v, handle_table::FILE_NAME),
            None => {
                if reg.is_none() {
                    reg = Some(open_registry_in(pid)?);
                }
                (reg.as_ref()?.lookup(key, &procs), "")
            }
        };
        match verdict {
            Lookup::Found(r) => Some(r),
            Lookup::Missing => None,
            Lookup::Skipped(skip) => {
                if skip.is_suspicious() {
                    if reg.is_none() {
                        reg = open_registry_in(pid);
                    }
                    let dir = reg
                        .as_ref()
                        .map(|r| r.dir().to_path_buf())
                        .unwrap_or_default();
                    let path = if place.is_empty() {
                        format!("{:?}", dir.join(key.file_name()).display().to_string())
                    } else {
                        format!(
                            "{} in {:?}",
                            key.file_name(),
                            dir.join(place).display().to_string()
                        )
                    };
                    say_once(
                        &SAID_SKIP,
                        format_args!(
                            "IPC provenance record {path} {skip}; not trusted (removed): this import has unknown provenance"
                        ),
                    );
                } else {
                    debug_log::log!(Debug, "{skip} key={}", key.short());
                }
                None
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Exports

/// After a successful `cuIpcGetMemHandle`/`cudaIpcGetMemHandle`.
///
/// # Safety
/// `handle` points to the 64 bytes the real call just wrote.
pub unsafe fn exported_mem(handle: *const IpcHandle, dptr: u64) {
    if handle.is_null() || !active() {
        return;
    }
    // SAFETY: caller guarantees readability.
    let h = unsafe { *handle };
    if recorded_already(&table_handle(Kind::Mem, h.reserved), signal_safe::pid()) {
        return;
    }
    let gpu = pointer_device(dptr).and_then(device_uuid).or_else(own_gpu);
    register_export(
        Key::from_bytes(Kind::Mem, &h.reserved),
        gpu,
        Location::Device,
        false,
    );
}

/// After a successful `cuIpcGetEventHandle`/`cudaIpcGetEventHandle`: the event lives in the
/// current context's device.
///
/// The event is remembered ([`event_records`]) so that its record goes when it is
/// destroyed ([`destroyed_event`]).
///
/// # Safety
/// `handle` points to the 64 bytes the real call just wrote.
pub unsafe fn exported_event(handle: *const IpcHandle, event: CUevent) {
    if handle.is_null() || !active() {
        return;
    }
    // SAFETY: caller guarantees readability.
    let h = unsafe { *handle };
    let pid = signal_safe::pid();
    // An event this process exports for the first time (PyTorch: one per share) has no
    // record of its to look for.
    let fresh = !event_records::holds(event as usize, pid, &h.reserved);
    if !fresh && recorded_already(&table_handle(Kind::Event, h.reserved), pid) {
        return;
    }
    let gpu = current_device().and_then(device_uuid).or_else(own_gpu);
    register_export(
        Key::from_bytes(Kind::Event, &h.reserved),
        gpu,
        Location::Device,
        fresh,
    );
    // No room: the record stays until its exporter has exited.
    let _ = event_records::remember(event as usize, pid, &h.reserved);
}

/// After a successful `cuEventDestroy`/`cudaEventDestroy`: the record of an event this
/// process exported goes with it (its handle cannot be opened any more). Whatever the
/// mode: it removes only this process's own record.
pub fn destroyed_event(event: CUevent) {
    if !event_records::any() {
        return;
    }
    let pid = signal_safe::pid();
    let Some(handle) = event_records::take(event as usize, pid) else {
        return;
    };
    if let Some(table) = registry_io::mapped_handle_table() {
        let key = table_handle(Kind::Event, handle);
        if let Some(at) = table.own(&key, pid) {
            if table.remove(at, &key, pid) {
                own_records::forget_slot(at);
                return;
            }
        }
    }
    let _ = shielded("removing", || {
        let reg = open_registry_in(pid)?;
        let key = Key::from_bytes(Kind::Event, &handle);
        match reg.remove(&key) {
            Ok(()) => {
                own_records::forget(pid, &key);
                debug_log::log!(
                    Debug,
                    "removed the record of destroyed event {}",
                    key.short()
                )
            }
            Err(e) => debug_log::log!(
                Debug,
                "cannot remove the record of destroyed event {}: {e}",
                key.short()
            ),
        }
        Some(())
    });
}

/// After a successful `cuMemExportToShareableHandle`.
///
/// # Safety
/// `shareable` points to what the real call wrote for `htype`.
pub unsafe fn exported_allocation(shareable: *const c_void, alloc: u64, htype: u32) {
    if !active() {
        return;
    }
    // SAFETY: forwarded from the caller.
    let Some(key) = (unsafe { shareable_key(Kind::VmmFd, Kind::Fabric, shareable, htype, false) })
    else {
        return;
    };
    let (location, gpu) = match allocation_location(alloc) {
        Some(l) => {
            let loc = Location::from_cu(l.type_);
            let gpu = if loc == Location::Device {
                device_uuid(l.id)
            } else {
                None
            };
            (loc, gpu)
        }
        None => (Location::Unknown, own_gpu()),
    };
    register_export(key, gpu, location, false);
}

/// After a successful `cuMemPoolExportToShareableHandle`.
///
/// # Safety
/// `shareable` points to what the real call wrote for `htype`.
pub unsafe fn exported_pool(shareable: *const c_void, htype: u32) {
    if !active() {
        return;
    }
    // SAFETY: forwarded from the caller.
    let Some(key) =
        (unsafe { shareable_key(Kind::PoolFd, Kind::PoolFabric, shareable, htype, false) })
    else {
        return;
    };
    register_export(
        key,
        current_device().and_then(device_uuid).or_else(own_gpu),
        Location::Unknown,
        false,
    );
}

/// After a successful `cuMemPoolExportPointer`.
///
/// # Safety
/// `data` points to the 64 bytes the real call just wrote.
pub unsafe fn exported_pool_pointer(data: *const IpcHandle, ptr: u64) {
    if data.is_null() || !active() {
        return;
    }
    // SAFETY: caller guarantees readability.
    let h = unsafe { *data };
    let gpu = pointer_device(ptr).and_then(device_uuid).or_else(own_gpu);
    register_export(
        Key::from_bytes(Kind::PoolPtr, &h.reserved),
        gpu,
        Location::Device,
        false,
    );
}

/// After a successful `cuMemGetHandleForAddressRange` of a dma-buf fd: device memory
/// shared outside CUDA IPC keeps the same provenance as a VMM fd (its file identity).
///
/// # Safety
/// `handle` points to the int the real call just wrote.
pub unsafe fn exported_dmabuf(handle: *const c_void, dptr: u64) {
    if handle.is_null() || !active() {
        return;
    }
    // SAFETY: caller guarantees `handle` points to the exported fd.
    let fd = unsafe { *(handle as *const c_int) };
    let Some(key) = file_ident(fd).and_then(|f| Key::from_file(Kind::DmaBuf, f).ok()) else {
        debug_log::log!(
            Debug,
            "dma-buf fd has no unique file identity: provenance unknown fd={fd}"
        );
        return;
    };
    let gpu = pointer_device(dptr).and_then(device_uuid).or_else(own_gpu);
    register_export(key, gpu, Location::Device, false);
}

// ---------------------------------------------------------------------------------------
// Imports

/// The key of an external memory object imported from an opaque fd
/// (`cuImportExternalMemory`, `cudaImportExternalMemory`): a dma-buf this node exported, or
/// a VMM shareable fd, whichever has a record (the fd's identity is the same text for
/// both). Other handle types (Windows, D3D, NvSciBuf) have no key: unknown provenance.
///
/// # Safety
/// `desc` is NULL or points to a readable handle descriptor.
pub unsafe fn key_of_external(desc: *const ExternalMemoryHandleDescHead) -> Option<Key> {
    if desc.is_null() {
        return None;
    }
    // SAFETY: caller guarantees readability.
    let d = unsafe { &*desc };
    if d.type_ != EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD {
        return None;
    }
    let f = file_ident(d.fd)?;
    let dmabuf = Key::from_file(Kind::DmaBuf, f).ok()?;
    if !active() || lookup(&dmabuf).is_some() {
        return Some(dmabuf);
    }
    let vmm = Key::from_file(Kind::VmmFd, f).ok()?;
    Some(if lookup(&vmm).is_some() { vmm } else { dmabuf })
}

/// The key of a 64-byte handle passed by value.
pub fn key_of(kind: Kind, h: &IpcHandle) -> Key {
    Key::from_bytes(kind, &h.reserved)
}

/// The key of a shareable handle given to an import function.
///
/// # Safety
/// As [`shareable_key`] with `by_value` (POSIX fd: the value; FABRIC: a pointer or NULL).
pub unsafe fn key_of_shareable(
    fd_kind: Kind,
    fabric_kind: Kind,
    os_handle: *const c_void,
    htype: u32,
) -> Option<Key> {
    // SAFETY: forwarded from the caller.
    unsafe { shareable_key(fd_kind, fabric_kind, os_handle, htype, true) }
}

/// A handle's first bytes for a report (`0011..eeff…`).
pub struct Short<'a>(pub &'a IpcHandle);

impl fmt::Display for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0.reserved[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("...")
    }
}

/// What an import decided, carried to the after-the-fact check.
#[derive(Clone, Copy)]
pub struct Checked(Option<Decision>);

/// R3 on an import. `location` is what the driver says about the imported memory, where it
/// was asked already (VMM). `Ok`: go on (keep the result for [`verify_mapping`]);
/// `Err(code)`: return `code` (enforce mode denied it).
pub fn check_import<R: Code>(
    id: usize,
    key: Option<Key>,
    location: Option<Location>,
    args: fmt::Arguments<'_>,
) -> Result<Checked, R> {
    if !active() {
        return Ok(Checked(None));
    }
    let rec = key.as_ref().and_then(lookup);
    let cfg = &state::get().config;
    let job = cfg.job.as_deref().map(registry::job_token);
    let gpu = own_gpu();
    let me = Importer {
        job: job.as_deref(),
        rank: cfg.rank,
        gpu: gpu.as_deref(),
        root: root_walk::id(),
    };
    let mut d = registry::decide(&me, rec.as_ref(), location, cfg.ipc);
    if matches!(d, Decision::Unknown | Decision::UnknownStrict) {
        if default_registry_taken() {
            d = d.without_registry();
        } else if d.after_overflow(&me) != d && registry_overflowed() {
            d = d.after_overflow(&me);
        }
    }
    let verdict = d.verdict(key.as_ref().map(Key::kind));
    if verdict.is_allow() {
        debug_log::log!(
            Debug,
            "IPC import allowed ({}): {} of {}, exported by {}",
            d.as_str(),
            crate::guard::table::TABLE[id].call(),
            key.as_ref()
                .map_or_else(|| "a handle with no identity".to_string(), Key::short),
            rec.as_ref().map_or_else(
                || "an unknown process".to_string(),
                |r| format!("pid {}", r.pid)
            )
        );
        return Ok(Checked(Some(d)));
    }
    let mut host = [0u8; 64];
    let host = signal_safe::hostname(&mut host);
    let short = key.as_ref().map(Key::short);
    let fields = RuleFields::Import {
        handle: key.as_ref().map(|k| Cow::Borrowed(k.kind().as_str())),
        key: short.as_deref().map(Cow::Borrowed),
        decision: Cow::Borrowed(d.as_str()),
        exporter: rec.as_ref().map(|r| Exporter {
            pid: r.pid,
            rank: r.rank,
            job: r.job.as_deref().map(Cow::Borrowed),
            gpu: r.gpu.as_deref().map(Cow::Borrowed),
            location: Cow::Borrowed(r.location.as_str()),
            // The exporter's root is on this host (the registry is per node).
            rank_root: r.root.map(|id| RootRef {
                pid: id.pid,
                start: id.start,
                host: Some(Cow::Borrowed(host)),
            }),
        }),
    };
    verdict::on_verdict_with(
        id,
        verdict,
        args,
        Some(Extra {
            fields,
            gpu: gpu.as_deref(),
        }),
    )?;
    Ok(Checked(Some(d)))
}

/// After a successful import that [`check_import`] allowed: where the driver reports the
/// mapping on a device other than the rank's device 0, R3 is broken after all.
/// `Err(code)`: the caller undoes the import and returns `code`.
pub fn verify_mapping<R: Code>(
    id: usize,
    checked: Checked,
    device: Option<i32>,
    args: fmt::Arguments<'_>,
) -> Result<(), R> {
    let Checked(Some(d)) = checked else {
        return Ok(());
    };
    if !d.verify_after() {
        return Ok(());
    }
    let Some(device) = device.filter(|&x| x != 0) else {
        return Ok(());
    };
    let v = Violation {
        rule: Rule::R3,
        code: DenyCode::NotPermitted,
        detail: Detail::ImportedOnOtherDevice { device },
    };
    verdict::on_verdict_with(
        id,
        Verdict::Violation(v),
        args,
        Some(Extra {
            fields: RuleFields::Mapping { device },
            gpu: None,
        }),
    )
}

/// The driver's verdict after a pointer import (legacy IPC, pool pointer).
pub fn verify_pointer<R: Code>(
    id: usize,
    checked: Checked,
    ptr: u64,
    args: fmt::Arguments<'_>,
) -> Result<(), R> {
    if matches!(checked, Checked(Some(d)) if d.verify_after()) {
        verify_mapping(id, checked, pointer_device(ptr), args)
    } else {
        Ok(())
    }
}

/// R3 on a VMM import, after the real import gave `alloc`: the allocation's location type
/// (host memory is always allowed) joins the registry's record.
pub fn check_vmm_import<R: Code>(
    id: usize,
    key: Option<Key>,
    alloc: u64,
    args: fmt::Arguments<'_>,
) -> Result<(), R> {
    if !active() {
        return Ok(());
    }
    let location = allocation_location(alloc).map(|l| Location::from_cu(l.type_));
    check_import::<R>(id, key, location, args).map(|_| ())
}

/// Undo a denied legacy import through the driver.
pub fn close_mem(ptr: u64) {
    if let Some(f) = internal::cuIpcCloseMemHandle() {
        // SAFETY: the driver's cuIpcCloseMemHandle on the pointer it just opened.
        let _ = unsafe { f(ptr) };
    }
}

/// Undo a denied runtime import of table entry `id`'s wrapper, in the runtime of that
/// wrapper's major: the mapping lives in the runtime that opened it (in a process with
/// both majors, a cu13 caller's import is closed in the 13 runtime).
pub fn close_mem_runtime(id: usize, ptr: *mut c_void) {
    let Some(f) = internal::cudaIpcCloseMemHandle(crate::guard::table::TABLE[id].major) else {
        return close_mem(ptr as u64);
    };
    let _s = RuntimeScope::enter();
    // SAFETY: as above.
    let _ = unsafe { f(ptr) };
}

/// Undo a denied VMM import.
pub fn release_allocation(handle: u64) {
    if let Some(f) = internal::cuMemRelease() {
        // SAFETY: the driver's cuMemRelease on the handle it just imported.
        let _ = unsafe { f(handle) };
    }
}

/// Undo a denied pool pointer import: cuda.h `cuMemPoolImportPointer` says an imported
/// pointer "may be freed with cuMemFree or cuMemFreeAsync"; the async form on the legacy
/// stream is the one every driver (and the fake) accepts for pool memory.
pub fn free_pointer(ptr: u64) {
    if let Some(f) = internal::cuMemFreeAsync() {
        // SAFETY: the driver's cuMemFreeAsync on the pointer it just imported, on the
        // legacy stream (NULL).
        let _ = unsafe { f(ptr, std::ptr::null_mut()) };
    }
}
