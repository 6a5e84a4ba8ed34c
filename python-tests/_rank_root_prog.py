"""Programs of test_rank_root.py (run under librankguard.so on the fake node, NVIDIA's
cuda.bindings, no launcher and no RANK): a learner that exports GPU memory over CUDA IPC
and starts a collector, and a lone exporter and importer.

    _rank_root_prog.py learner DIR COLLECTOR_CVD HOW WHEN
        HOW: subprocess | spawn | forkserver | grandchild (a child on the learner's
             CVD starts the collector); WHEN: after | before the learner's first cuInit.
        Prints "RESULT {json}": the learner's pid and start time, the collector's pid,
        exit status and import result.
    _rank_root_prog.py export DIR        export a buffer, write DIR/handle, wait for DIR/done
    _rank_root_prog.py import DIR        import DIR/handle, write DIR/import.result

Hand-shakes are files in DIR (written by rename), so every start method works alike.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import time

SIZE = 1 << 20
DEADLINE = 60


def pattern(n: int) -> bytes:
    return bytes((i * 31 + 5) & 0xFF for i in range(n))


def ok(result):
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {int(err)}")
    return rest[0] if len(rest) == 1 else rest


def context():
    from cuda.bindings import driver as d
    ok(d.cuInit(0))
    ok(d.cuCtxSetCurrent(ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))))
    return d


def put(path: pathlib.Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def wait_for(path: pathlib.Path, alive=lambda: True) -> bool:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if path.exists():
            return True
        if not alive():
            return path.exists()
        time.sleep(0.02)
    raise TimeoutError(f"{path} never appeared")


def start_time(pid: int | str = "self") -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[19])


def export(d, where: pathlib.Path):
    p = ok(d.cuMemAlloc(SIZE))
    ok(d.cuMemcpyHtoD(p, pattern(SIZE), SIZE))
    put(where / "handle", bytes(ok(d.cuIpcGetMemHandle(p)).reserved).hex())
    return p


def collector(where: str, name: str = "collector"):
    """Initialise CUDA (the R1 check), say so, then import the learner's buffer."""
    where = pathlib.Path(where)
    d = context()
    put(where / f"{name}.inited", str(os.getpid()))
    wait_for(where / "handle")
    h = d.CUipcMemHandle()
    h.reserved = bytes.fromhex((where / "handle").read_text())
    err, p = d.cuIpcOpenMemHandle(h, d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    intact = None
    if int(err) == 0:
        buf = bytearray(SIZE)
        ok(d.cuMemcpyDtoH(buf, p, SIZE))
        intact = bytes(buf) == pattern(SIZE)
        ok(d.cuIpcCloseMemHandle(p))
    put(where / f"{name}.result", json.dumps({"pid": os.getpid(), "rc": int(err), "intact": intact}))


class Child:
    """A collector started one of four ways; `alive()` and `wait()` alike for all."""

    def __init__(self, how: str, where: pathlib.Path, cvd: str):
        self.mp = None
        self.proc = None
        code = f"import sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); " \
               f"import _rank_root_prog as m; m.collector({str(where)!r})"
        if how == "subprocess":
            self.proc = subprocess.Popen([sys.executable, "-c", code],
                                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=cvd))
        elif how == "grandchild":
            # a child on the learner's own GPU (inherited CVD) re-points its child
            mid = (f"import os, subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {code!r}], "
                   f"env=dict(os.environ, CUDA_VISIBLE_DEVICES={cvd!r})).returncode)")
            self.proc = subprocess.Popen([sys.executable, "-c", mid])
        else:
            ctx = mp.get_context(how)
            old = os.environ["CUDA_VISIBLE_DEVICES"]
            os.environ["CUDA_VISIBLE_DEVICES"] = cvd     # spawn execs, the forkserver starts, with it
            self.mp = ctx.Process(target=collector, args=(str(where),))
            self.mp.start()
            os.environ["CUDA_VISIBLE_DEVICES"] = old

    def alive(self) -> bool:
        return self.mp.is_alive() if self.mp else self.proc.poll() is None

    def wait(self) -> int:
        if self.mp:
            self.mp.join(DEADLINE)
            return self.mp.exitcode
        return self.proc.wait(DEADLINE)


def learner(where: str, cvd: str, how: str, when: str) -> int:
    where = pathlib.Path(where)
    d = None
    if when == "after":
        d = context()
        buf = export(d, where)
    child = Child(how, where, cvd)
    if when == "before":
        # the collector initialises CUDA first (or is stopped doing so)
        wait_for(where / "collector.inited", child.alive)
        d = context()
        buf = export(d, where)
    status = child.wait()
    res = where / "collector.result"
    print("RESULT " + json.dumps({
        "learner_pid": os.getpid(), "learner_start": start_time(),
        "collector_status": status,
        "collector": json.loads(res.read_text()) if res.exists() else None,
    }), flush=True)
    ok(d.cuMemFree(buf))
    print("learner finished", flush=True)
    return 0


def main(argv):
    role, where = argv[0], pathlib.Path(argv[1])
    if role == "learner":
        return learner(str(where), *argv[2:5])
    if role == "export":
        d = context()
        export(d, where)
        print(f"exporter pid {os.getpid()}", flush=True)
        wait_for(where / "done")
        return 0
    if role == "import":
        wait_for(where / "handle")
        collector(str(where), "import")
        return 0
    raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
