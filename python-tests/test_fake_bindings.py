"""NVIDIA's real `cuda-bindings` (`from cuda.bindings import driver`) against the fake driver.

cuda.bindings dlopen()s libcuda.so.1 by name, makes one dlsym (cuGetProcAddress_v2) and
then hundreds of cuGetProcAddress_v2 calls (docs/design.md §5), so this checks the fake's
entry-point table with a real client. Each scenario runs in a fresh interpreter with the
scrubbed environment (LD_LIBRARY_PATH = the fake), because the driver reads its
environment once, at cuInit.
"""
from __future__ import annotations

import textwrap

from conftest import PYTHON, clean_env, run

PRELUDE = textwrap.dedent("""
    from cuda.bindings import driver

    def ok(res):
        # cuda.bindings returns (CUresult, *values); fail loudly on any error code.
        err, *rest = res if isinstance(res, tuple) else (res,)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else rest
""")


def run_py(body: str, **env: str | None):
    p = run([PYTHON, "-c", PRELUDE + textwrap.dedent(body)], env=clean_env(**env), timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_init_count_get_uuid():
    out = run_py("""
        ok(driver.cuInit(0))
        print("count", ok(driver.cuDeviceGetCount()))
        dev = ok(driver.cuDeviceGet(0))
        print("uuid", bytes(ok(driver.cuDeviceGetUuid(dev)).bytes).hex())
        err, _ = driver.cuDeviceGet(2)
        print("get2", int(err))
        print("version", ok(driver.cuDriverGetVersion()))
    """, CUDA_VISIBLE_DEVICES="5,6")
    assert "count 2" in out
    assert "uuid 15c0ffee000040008000000000000005" in out      # physical GPU 5
    assert "get2 101" in out                                   # CUDA_ERROR_INVALID_DEVICE
    assert "version 12090" in out


def test_primary_context_memory_roundtrip():
    out = run_py("""
        ok(driver.cuInit(0))
        dev = ok(driver.cuDeviceGet(0))
        ctx = ok(driver.cuDevicePrimaryCtxRetain(dev))
        ok(driver.cuCtxSetCurrent(ctx))
        print("current", int(ok(driver.cuCtxGetCurrent())) == int(ctx))
        n = 1 << 16
        src = bytes((i * 17 + 5) % 256 for i in range(n))
        dptr = ok(driver.cuMemAlloc(n))
        ok(driver.cuMemcpyHtoD(dptr, src, n))
        dst = bytearray(n)
        ok(driver.cuMemcpyDtoH(dst, dptr, n))
        print("roundtrip", bytes(dst) == src)
        ordinal = ok(driver.cuPointerGetAttribute(
            driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr))
        print("ordinal", ordinal)
        ok(driver.cuMemFree(dptr))
        ok(driver.cuDevicePrimaryCtxRelease(dev))
    """, CUDA_VISIBLE_DEVICES="3")
    assert "current True" in out
    assert "roundtrip True" in out
    assert "ordinal 0" in out


IPC = """
    import multiprocessing as mp

    N = 1 << 20
    PATTERN = bytes((i * 31 + 7) % 256 for i in range(N))

    def setup():
        ok(driver.cuInit(0))
        dev = ok(driver.cuDeviceGet(0))
        ctx = ok(driver.cuDevicePrimaryCtxRetain(dev))
        ok(driver.cuCtxSetCurrent(ctx))

    def importer(q_in, q_out, cvd):
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = cvd      # read at this process's cuInit
        setup()
        handle = driver.CUipcMemHandle()
        handle.reserved = q_in.get()
        ptr = ok(driver.cuIpcOpenMemHandle(
            handle, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        buf = bytearray(N)
        ok(driver.cuMemcpyDtoH(buf, ptr, N))
        same = bytes(buf) == PATTERN
        ok(driver.cuMemcpyHtoD(ptr, b"\\xab" * 64, 64))
        ok(driver.cuIpcCloseMemHandle(ptr))
        q_out.put(same)

    if __name__ == "__main__":
        setup()
        dptr = ok(driver.cuMemAlloc(N))
        ok(driver.cuMemcpyHtoD(dptr, PATTERN, N))
        handle = ok(driver.cuIpcGetMemHandle(dptr))
        mp.set_start_method("spawn")
        q_in, q_out = mp.Queue(), mp.Queue()
        child = mp.Process(target=importer, args=(q_in, q_out, CHILD_CVD))
        child.start()
        q_in.put(bytes(handle.reserved))
        print("child-read-pattern", q_out.get(timeout=60))
        child.join(60)
        print("child-exit", child.exitcode)
        back = bytearray(128)
        ok(driver.cuMemcpyDtoH(back, dptr, 128))
        print("parent-sees-child-write", bytes(back[:64]) == b"\\xab" * 64 and
              bytes(back[64:]) == PATTERN[64:128])
        ok(driver.cuMemFree(dptr))
"""


def _ipc(tmp_path, parent_cvd, child_cvd):
    script = tmp_path / "ipc.py"
    script.write_text(PRELUDE + textwrap.dedent(IPC).replace("CHILD_CVD", repr(child_cvd)))
    p = run([PYTHON, script], env=clean_env(CUDA_VISIBLE_DEVICES=parent_cvd), timeout=120)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert "child-read-pattern True" in p.stdout, p.stdout
    assert "child-exit 0" in p.stdout, p.stdout
    assert "parent-sees-child-write True" in p.stdout, p.stdout


def test_ipc_between_two_python_processes_same_gpu(tmp_path):
    _ipc(tmp_path, "2", "2")


def test_ipc_between_two_python_processes_other_gpu(tmp_path):
    # The child sees only GPU 4; the handle names GPU 2's memory. The fake opens it, as
    # the runtime docs promise ("can open handles to devices that may not be visible");
    # stopping it is the guard's job (R3).
    _ipc(tmp_path, "2", "4")
