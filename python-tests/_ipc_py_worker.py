"""R3 exchange in Python with NVIDIA's cuda.bindings and multiprocessing (spawn): run by
test_ipc_python.py under librankguard.so (LD_PRELOAD comes with this script's
environment); each spawned child sets its own CUDA_VISIBLE_DEVICES and RANK in os.environ
before importing cuda.bindings, like a training program's collectors and learner.

    _ipc_py_worker.py <mem|event|vmm> <exporter cvd> <exporter rank> <importer cvd> <importer rank>
                      [<exporter's RANKGUARD_REGISTRY>]

Prints one JSON line: the exporter's pid, the importer's result code and whether every byte
the exporter wrote read back. VMM fds travel with multiprocessing.reduction.send_handle
(SCM_RIGHTS).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from multiprocessing import reduction

SIZE = 1 << 20
VMM_SIZE = 2 << 20


def pattern(n: int) -> bytearray:
    return bytearray((i * 31 + 5) & 0xFF for i in range(n))


def _setup(cvd: str, rank: str, registry: str | None = None):
    os.environ["CUDA_VISIBLE_DEVICES"] = cvd
    os.environ["RANK"] = rank
    if registry:
        os.environ["RANKGUARD_REGISTRY"] = registry
    from cuda.bindings import driver as d          # after the environment is set
    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    return d


def ok(result):
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {int(err)}")
    return rest[0] if len(rest) == 1 else rest


def _vmm_prop(d):
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    return prop


def _vmm_map(d, handle):
    va = ok(d.cuMemAddressReserve(VMM_SIZE, 0, 0, 0))
    ok(d.cuMemMap(va, VMM_SIZE, 0, handle, 0))
    acc = d.CUmemAccessDesc()
    acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 0
    acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(d.cuMemSetAccess(va, VMM_SIZE, [acc], 1))
    return va


def exporter(kind, cvd, rank, out, conn, done, registry):
    d = _setup(cvd, rank, registry)
    if kind == "mem":
        p = ok(d.cuMemAlloc(SIZE))
        ok(d.cuMemcpyHtoD(p, pattern(SIZE), SIZE))
        out.put(("mem", bytes(ok(d.cuIpcGetMemHandle(p)).reserved)))
    elif kind == "event":
        flags = d.CUevent_flags.CU_EVENT_INTERPROCESS | d.CUevent_flags.CU_EVENT_DISABLE_TIMING
        e = ok(d.cuEventCreate(flags))
        ok(d.cuEventRecord(e, 0))
        out.put(("event", bytes(ok(d.cuIpcGetEventHandle(e)).reserved)))
    else:
        h = ok(d.cuMemCreate(VMM_SIZE, _vmm_prop(d), 0))
        va = _vmm_map(d, h)
        ok(d.cuMemcpyHtoD(va, pattern(VMM_SIZE), VMM_SIZE))
        fd = ok(d.cuMemExportToShareableHandle(
            h, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
        out.put(("vmm", b""))
        pid = conn.recv()
        reduction.send_handle(conn, fd, pid)
    done.wait(60)          # a legacy handle needs its exporter alive


def importer(kind, cvd, rank, handle, conn, out):
    d = _setup(cvd, rank)
    n = SIZE if kind == "mem" else VMM_SIZE
    buf = bytearray(n)
    intact = None
    if kind == "mem":
        h = d.CUipcMemHandle()
        h.reserved = handle
        err, p = d.cuIpcOpenMemHandle(h, d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        if int(err) == 0:
            ok(d.cuMemcpyDtoH(buf, p, n))
            intact = buf == pattern(n)
            ok(d.cuIpcCloseMemHandle(p))
    elif kind == "event":
        h = d.CUipcEventHandle()
        h.reserved = handle
        err, e = d.cuIpcOpenEventHandle(h)
        if int(err) == 0:
            ok(d.cuEventSynchronize(e))
    else:
        conn.send(os.getpid())
        fd = reduction.recv_handle(conn)
        err, h = d.cuMemImportFromShareableHandle(
            fd, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        os.close(fd)
        if int(err) == 0:
            va = _vmm_map(d, h)
            ok(d.cuMemcpyDtoH(buf, va, n))
            intact = buf == pattern(n)
    out.put((int(err), intact))


def main(argv):
    kind, xcvd, xrank, icvd, irank = argv[:5]
    xregistry = argv[5] if len(argv) > 5 else None
    ctx = mp.get_context("spawn")
    handles, results = ctx.Queue(), ctx.Queue()
    done = ctx.Event()
    a, b = ctx.Pipe()
    x = ctx.Process(target=exporter, args=(kind, xcvd, xrank, handles, a, done, xregistry))
    x.start()
    _, handle = handles.get(timeout=60)
    i = ctx.Process(target=importer, args=(kind, icvd, irank, handle, b, results))
    i.start()
    rc, intact = results.get(timeout=60)
    i.join(60)
    done.set()
    x.join(60)
    print(json.dumps({"exporter_pid": x.pid, "rc": rc, "intact": intact,
                      "exit": [x.exitcode, i.exitcode]}))
    return 0 if x.exitcode == 0 and i.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
