//! What the guard must remember or read to judge the calls that reach another device
//! through an object rather than an ordinal: memory pools (whose device a later
//! `cuMemPoolSetAccess` grant crosses) and the two sides of a 3D peer copy.
//!
//! Pools: the guard learns a pool's device where it sees one handed out or created
//! (`cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`, `cuMemPoolCreate` at a device
//! location, and the runtime twins, which reach the driver's). Up to [`MAX_POOLS`] pools are
//! remembered in a fixed table of atomics: no allocation, no lock, safe in a forked child
//! and under re-entry. A pool the guard never saw (imported, or past the table) has no
//! known device: its grant is judged by the descriptor alone (R2), which under R1 is the
//! whole story (the rank sees one device).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::guard::process::driver_query;
use crate::guard::sys::ffi::{
    cudaMemcpy3DPeerParmsHead, CUcheckpointRestoreArgsHead, CUmemAccessDesc, CUmemLocation,
    CUmemcpyAttributes, FabricCopyBatchOp, GraphNodeParamsHead, MemAllocNodeParamsHead,
    Memcpy3DBatchOp, CUDA_MEMCPY3D_PEER, CU_MEMORYTYPE_ARRAY, GRAPH_NODE_TYPE_MEM_ALLOC,
    OPERAND_TYPE_POINTER,
};
use crate::policy::{self, Verdict};

/// How many pools' devices are remembered (a process has a default pool per device and a
/// few of its own).
pub const MAX_POOLS: usize = 256;

const UNKNOWN: i32 = i32::MIN;

static POOL: [AtomicUsize; MAX_POOLS] = [const { AtomicUsize::new(0) }; MAX_POOLS];
/// Each pool's device, stored as [`stored`] says: 0, its value at load, reads as UNKNOWN,
/// so the array is zero-initialised (`.bss`, not a page of `.data`: docs/benchmarks.md,
/// "Written pages").
static DEVICE: [AtomicI32; MAX_POOLS] = [const { AtomicI32::new(0) }; MAX_POOLS];

/// `dev` as DEVICE stores it: minus UNKNOWN, wrapping (UNKNOWN becomes 0).
fn stored(dev: i32) -> i32 {
    dev.wrapping_sub(UNKNOWN)
}

/// Remember that `pool` lives on device `dev` (a later entry for the same pool wins).
pub fn remember_pool(pool: *mut c_void, dev: i32) {
    let p = pool as usize;
    if p == 0 {
        return;
    }
    for i in 0..MAX_POOLS {
        match POOL[i].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                DEVICE[i].store(stored(dev), Ordering::Release);
                return;
            }
            Err(q) if q == p => {
                DEVICE[i].store(stored(dev), Ordering::Release);
                return;
            }
            Err(_) => {}
        }
    }
}

/// The device of a pool the guard saw handed out or created, if any.
pub fn pool_device(pool: *mut c_void) -> Option<i32> {
    let p = pool as usize;
    if p == 0 {
        return None;
    }
    for i in 0..MAX_POOLS {
        match POOL[i].load(Ordering::Acquire) {
            0 => return None,
            q if q == p => {
                let d = DEVICE[i].load(Ordering::Acquire).wrapping_add(UNKNOWN);
                return (d != UNKNOWN).then_some(d);
            }
            _ => {}
        }
    }
    None
}

/// R2/R4 on every descriptor of a pool access grant (`cuMemPoolSetAccess`,
/// `cudaMemPoolSetAccess`: the runtime's descriptor has the driver's layout).
///
/// # Safety
/// `desc` is NULL or points to `count` readable descriptors.
pub unsafe fn pool_access(
    pool: *mut c_void,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> (Verdict, usize) {
    if desc.is_null() {
        return (Verdict::Allow, 0);
    }
    let dev = pool_device(pool);
    for i in 0..count {
        // SAFETY: caller guarantees `count` readable descriptors.
        let l = unsafe { (*desc.add(i)).location };
        let v = policy::pool_access(dev, l.type_, l.id);
        if !v.is_allow() {
            return (v, i);
        }
    }
    (Verdict::Allow, 0)
}

/// R4 between the two contexts of a 3D peer copy (an array side's context is ignored by
/// the driver, so it is by the guard).
///
/// # Safety
/// `p` is NULL or points to a readable `CUDA_MEMCPY3D_PEER`.
pub unsafe fn memcpy3d_peer(p: *const CUDA_MEMCPY3D_PEER) -> Verdict {
    if p.is_null() {
        return Verdict::Allow; // the driver refuses it itself
    }
    // SAFETY: caller guarantees readability.
    let c = unsafe { &*p };
    if c.srcMemoryType == CU_MEMORYTYPE_ARRAY || c.dstMemoryType == CU_MEMORYTYPE_ARRAY {
        // One side is an array, whose context the driver takes from the array itself; the
        // other side's context is the current one or the given one: compare those we have.
        return Verdict::Allow;
    }
    if c.srcContext == c.dstContext {
        return Verdict::Allow;
    }
    match (
        driver_query::context_device(c.srcContext),
        driver_query::context_device(c.dstContext),
    ) {
        (Some(a), Some(b)) => policy::peer(a, b),
        _ => policy::peer_unknown(),
    }
}

/// The two devices of a runtime 3D peer copy, `(dst, src)`.
///
/// # Safety
/// `p` is NULL or points to a readable `cudaMemcpy3DPeerParms`.
pub unsafe fn memcpy3d_peer_devices(p: *const cudaMemcpy3DPeerParmsHead) -> Option<(i32, i32)> {
    // SAFETY: caller guarantees readability.
    unsafe { p.as_ref() }.map(|c| (c.dstDevice, c.srcDevice))
}

/// R2 on a graph memory-allocation node: the pool location and every access descriptor
/// (peer access to the node's memory is a grant like `cuMemSetAccess`).
///
/// # Safety
/// `p` is NULL or points to readable node parameters whose `accessDescs` holds
/// `accessDescCount` readable descriptors (or is NULL).
pub unsafe fn alloc_node(p: *const MemAllocNodeParamsHead) -> Verdict {
    // SAFETY: caller guarantees readability.
    let Some(n) = (unsafe { p.as_ref() }) else {
        return Verdict::Allow;
    };
    let l = n.poolProps.location;
    let v = policy::location(l.type_, l.id);
    if !v.is_allow() || n.accessDescs.is_null() {
        return v;
    }
    // SAFETY: caller guarantees `accessDescCount` readable descriptors.
    let d = unsafe { std::slice::from_raw_parts(n.accessDescs, n.accessDescCount) };
    policy::first(
        d.iter()
            .map(|a| policy::location(a.location.type_, a.location.id)),
    )
}

/// R2 on a generic graph node's parameters (`cuGraphAddNode`, `cuGraphNodeSetParams`,
/// `cuGraphExecNodeSetParams`, runtime twins): a memory-allocation node as
/// [`alloc_node`]; other node types name no device here.
///
/// # Safety
/// `p` is NULL or points to readable node parameters (as for [`alloc_node`] when the type
/// is a memory allocation).
pub unsafe fn node_params(p: *const GraphNodeParamsHead) -> Verdict {
    // SAFETY: caller guarantees readability.
    match unsafe { p.as_ref() } {
        Some(n) if n.type_ == GRAPH_NODE_TYPE_MEM_ALLOC => {
            // SAFETY: a memory-allocation node's union member is the allocation's parameters.
            unsafe { alloc_node(&raw const n.alloc) }
        }
        _ => Verdict::Allow,
    }
}

/// R2 on the location hints of batch and attribute copies (`cuMemcpyBatchAsync`,
/// `cuMemcpyWithAttributesAsync`, runtime twins): `srcLocHint` and `dstLocHint` of each of
/// the first `min(n, count)` attributes (a batch has at most one attribute per copy; the
/// driver refuses more, so nothing past `count` is read). Host and host-NUMA hints are
/// not devices.
///
/// # Safety
/// `attrs` is NULL or points to `n` readable attributes.
pub unsafe fn copy_hints(attrs: *const CUmemcpyAttributes, n: usize, count: usize) -> Verdict {
    if attrs.is_null() {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `n` readable attributes; fewer are read.
    let a = unsafe { std::slice::from_raw_parts(attrs, n.min(count)) };
    policy::first(a.iter().flat_map(|x| {
        [
            policy::location(x.srcLocHint.type_, x.srcLocHint.id),
            policy::location(x.dstLocHint.type_, x.dstLocHint.id),
        ]
    }))
}

/// R2 on the location hints of the pointer operands of 3D batch and attribute copies
/// (`cuMemcpy3DBatchAsync`, `cuMemcpy3DWithAttributesAsync`, runtime twins); an array
/// operand names no location.
///
/// # Safety
/// `ops` is NULL or points to `n` readable operations.
pub unsafe fn copy_ops_3d(ops: *const Memcpy3DBatchOp, n: usize) -> Verdict {
    if ops.is_null() {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `n` readable operations.
    let s = unsafe { std::slice::from_raw_parts(ops, n) };
    pointer_hints(s.iter().flat_map(|op: &Memcpy3DBatchOp| {
        [
            (op.src.type_, op.src.locHint),
            (op.dst.type_, op.dst.locHint),
        ]
    }))
}

/// R2 on the location hints of the pointer operands of a fabric copy batch
/// (`cuFabricCpyBatchAsync`); a logical-endpoint operand's devices were judged when they
/// were added to or bound in the endpoint.
///
/// # Safety
/// `ops` is NULL or points to `n` readable operations.
pub unsafe fn fabric_ops(ops: *const FabricCopyBatchOp, n: usize) -> Verdict {
    if ops.is_null() {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `n` readable operations.
    let s = unsafe { std::slice::from_raw_parts(ops, n) };
    pointer_hints(s.iter().flat_map(|op: &FabricCopyBatchOp| {
        [
            (op.src.type_, op.src.locHint),
            (op.dst.type_, op.dst.locHint),
        ]
    }))
}

/// The first violation among operands given as (operand type, location hint): only a
/// pointer operand's hint is a location (the union's other members name none).
fn pointer_hints(operands: impl Iterator<Item = (u32, CUmemLocation)>) -> Verdict {
    policy::first(operands.map(|(t, l)| {
        if t == OPERAND_TYPE_POINTER {
            policy::location(l.type_, l.id)
        } else {
            Verdict::Allow
        }
    }))
}

/// R2 on every location of a batch prefetch (`cuMemPrefetchBatchAsync`,
/// `cuMemDiscardAndPrefetchBatchAsync`).
///
/// # Safety
/// `locs` is NULL or points to `n` readable locations.
pub unsafe fn locations(locs: *const CUmemLocation, n: usize) -> Verdict {
    if locs.is_null() {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `n` readable locations.
    let s = unsafe { std::slice::from_raw_parts(locs, n) };
    policy::first(s.iter().map(|l| policy::location(l.type_, l.id)))
}

/// R1 on a checkpoint restore's GPU pairs.
///
/// # Safety
/// `args` is NULL or points to readable restore arguments whose `gpuPairs` (when not NULL)
/// holds `gpuPairsCount` readable pairs.
pub unsafe fn restore(args: *const CUcheckpointRestoreArgsHead) -> Verdict {
    // SAFETY: caller guarantees readability.
    let Some(a) = (unsafe { args.as_ref() }) else {
        return Verdict::Allow;
    };
    if a.gpuPairs.is_null() {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `gpuPairsCount` readable pairs.
    let pairs = unsafe { std::slice::from_raw_parts(a.gpuPairs, a.gpuPairsCount as usize) };
    policy::restore(pairs.iter().map(|p| (&p.oldUuid.bytes, &p.newUuid.bytes)))
}

/// R2 on every entry of a device list (`cudaSetValidDevices`).
///
/// # Safety
/// `list` is NULL or points to `len` readable ints.
pub unsafe fn device_list(list: *const i32, len: i32) -> Verdict {
    if list.is_null() || len <= 0 {
        return Verdict::Allow;
    }
    // SAFETY: caller guarantees `len` readable ints.
    let s = unsafe { std::slice::from_raw_parts(list, len as usize) };
    policy::first(s.iter().map(|&d| policy::ordinal(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::sys::ffi::{FabricCpyOperand, Memcpy3DOperand};

    #[test]
    fn pools_remember_their_device() {
        let a = 0x1000 as *mut c_void;
        let b = 0x2000 as *mut c_void;
        assert_eq!(pool_device(a), None);
        remember_pool(a, 1);
        remember_pool(b, 0);
        assert_eq!(pool_device(a), Some(1));
        assert_eq!(pool_device(b), Some(0));
        remember_pool(a, 2);
        assert_eq!(pool_device(a), Some(2));
        assert_eq!(pool_device(std::ptr::null_mut()), None);
        assert_eq!(pool_device(0x3000 as *mut c_void), None);
        // DEVICE stores an ordinal minus UNKNOWN: every ordinal, negative ones (the CPU's
        // -1) included, reads back; UNKNOWN, the zero of a fresh slot, reads as none.
        let c = 0x4000 as *mut c_void;
        remember_pool(c, -1);
        assert_eq!(pool_device(c), Some(-1));
        remember_pool(c, i32::MAX);
        assert_eq!(pool_device(c), Some(i32::MAX));
        remember_pool(c, UNKNOWN);
        assert_eq!(pool_device(c), None);
    }

    #[test]
    fn grants_and_lists() {
        let pool = 0x5000 as *mut c_void;
        remember_pool(pool, 1);
        let d = |id| CUmemAccessDesc {
            location: crate::guard::sys::ffi::CUmemLocation { type_: 1, id },
            flags: 3,
        };
        let grant = [d(0)];
        // SAFETY: a local array of one descriptor.
        let (v, i) = unsafe { pool_access(pool, grant.as_ptr(), 1) };
        assert!(
            matches!(v, Verdict::Violation(x) if x.rule == policy::Rule::R4),
            "{v:?}"
        );
        assert_eq!(i, 0);
        let two = [d(0), d(3)];
        // SAFETY: as above, two descriptors; an unknown pool.
        let (v, i) = unsafe { pool_access(0x6000 as *mut c_void, two.as_ptr(), 2) };
        assert!(matches!(v, Verdict::Violation(x) if x.rule == policy::Rule::R2));
        assert_eq!(i, 1);
        let ok = [0, 0];
        // SAFETY: two readable ints.
        assert!(unsafe { device_list(ok.as_ptr(), 2) }.is_allow());
        let bad = [0, 1];
        // SAFETY: two readable ints.
        assert!(!unsafe { device_list(bad.as_ptr(), 2) }.is_allow());
    }

    fn loc(type_: u32, id: i32) -> CUmemLocation {
        CUmemLocation { type_, id }
    }

    #[test]
    fn copy_hints_are_r2_and_bounded() {
        let a = |s: CUmemLocation, d: CUmemLocation| CUmemcpyAttributes {
            srcAccessOrder: 1,
            srcLocHint: s,
            dstLocHint: d,
            flags: 0,
        };
        let attrs = [a(loc(1, 0), loc(2, 5)), a(loc(3, 1), loc(1, 2))];
        // SAFETY: two readable attributes.
        assert!(unsafe { copy_hints(attrs.as_ptr(), 1, 3) }.is_allow());
        // SAFETY: as above.
        let v = unsafe { copy_hints(attrs.as_ptr(), 2, 3) };
        assert!(
            matches!(v, Verdict::Violation(x) if x.rule == policy::Rule::R2),
            "{v:?}"
        );
        // Never past `count`: the second attribute (device 2) is not read for one copy.
        // SAFETY: as above.
        assert!(unsafe { copy_hints(attrs.as_ptr(), 2, 1) }.is_allow());
        // SAFETY: NULL.
        assert!(unsafe { copy_hints(std::ptr::null(), 5, 5) }.is_allow());
        // Host, host-NUMA and host-NUMA-current hints are not devices, whatever their id.
        let host = [a(loc(2, 3), loc(3, 1)), a(loc(4, 2), loc(1, 0))];
        // SAFETY: two readable attributes.
        assert!(unsafe { copy_hints(host.as_ptr(), 2, 2) }.is_allow());
    }

    #[test]
    fn operands_hints_only_of_pointers() {
        let operand = |type_, l| Memcpy3DOperand {
            type_,
            ptr: 0x1000,
            rowLength: 0,
            layerHeight: 0,
            locHint: l,
        };
        let op = |s, d| Memcpy3DBatchOp {
            src: s,
            dst: d,
            extent: [1, 1, 1],
            srcAccessOrder: 1,
            flags: 0,
        };
        // An array operand's bytes where a pointer's hint would be are not a location.
        let ops = [
            op(operand(1, loc(1, 0)), operand(2, loc(1, 3))),
            op(operand(1, loc(2, 0)), operand(1, loc(1, 1))),
        ];
        // SAFETY: two readable operations.
        assert!(unsafe { copy_ops_3d(ops.as_ptr(), 1) }.is_allow());
        // SAFETY: as above.
        assert!(!unsafe { copy_ops_3d(ops.as_ptr(), 2) }.is_allow());
        let f = |type_, l| FabricCpyOperand {
            type_,
            ptr: 0x1000,
            locHint: l,
        };
        let fops = [FabricCopyBatchOp {
            src: f(2, loc(1, 7)),
            dst: f(1, loc(1, 0)),
            size: 8,
            flags: 0,
        }];
        // SAFETY: one readable operation.
        assert!(unsafe { fabric_ops(fops.as_ptr(), 1) }.is_allow());
        let fops = [FabricCopyBatchOp {
            src: f(1, loc(1, 7)),
            dst: f(1, loc(1, 0)),
            size: 8,
            flags: 0,
        }];
        // SAFETY: one readable operation.
        assert!(!unsafe { fabric_ops(fops.as_ptr(), 1) }.is_allow());
    }
}
