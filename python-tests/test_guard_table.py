"""The guard's table against NVIDIA's own list of ABI variants (issue 3).

cudaTypedefs.h names every variant of every driver function (`PFN_cuX_vNNNNN[_ptds|_ptsz]`);
the fake driver's generated routing table (c-tests/build/gen/fakecuda_routes.c) maps each
(name, version, per-thread) to its ABI symbol. For every driver function the guard guards,
every variant must be exported by librankguard.so and cuGetProcAddress must hand out the
guard's wrapper of exactly that variant, per-thread flag included. A missing variant is a
hole (or, with the fail-closed routing, a refused entry point: the cuMemFreeAsync_ptsz bug
seen on a real GPU)."""
from __future__ import annotations

import re
import subprocess

from conftest import FAKE, GUARD, ROOT, clean_env
from _guard import prog

ROUTES = ROOT / "c-tests" / "build" / "gen" / "fakecuda_routes.c"
ROW = re.compile(r'^\s*\{"(\w+)", (\d+), ([01]), [01], "(\w+)",', re.M)


def _exports(lib) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {l.split()[-1] for l in out.splitlines() if " T " in l}


def _guarded_rows():
    rows = [(b, int(v), int(pt), abi) for b, v, pt, abi in ROW.findall(ROUTES.read_text())]
    assert len(rows) > 500, "routing table not generated"
    exported = _exports(GUARD)
    bases = {b for b, _, _, abi in rows if abi in exported}
    return [r for r in rows if r[0] in bases], exported, bases


def test_every_variant_of_a_guarded_function_is_exported():
    rows, exported, bases = _guarded_rows()
    assert {"cuCtxCreate", "cuDeviceGet", "cuMemcpyPeer", "cuIpcOpenMemHandle",
            "cuGetProcAddress"} <= bases
    missing = sorted({abi for _, _, _, abi in rows if abi not in exported})
    assert missing == [], f"guarded functions with unexported ABI variants: {missing}"


def test_cu_get_proc_address_hands_out_the_wrapper_of_each_variant():
    rows, _, _ = _guarded_rows()
    queries = "".join(f"{b} {v} {2 if pt else 0}\n" for b, v, pt, _ in rows)
    # also ask every version with the per-thread flag: functions without a per-thread
    # variant must still come back (as their default variant), never refused
    queries += "".join(f"{b} {v} 2\n" for b, v, pt, _ in rows if not pt)
    env = clean_env(CUDA_VISIBLE_DEVICES="0", LD_PRELOAD=str(GUARD))
    p = subprocess.run([str(prog("guard_gpa_all"))], input=queries, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANKGUARD" not in p.stderr, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == len(queries.splitlines())
    want = {(b, v, 2 if pt else 0): abi for b, v, pt, abi in rows}
    for line in lines:
        name, version, flags, rc, st, lib, sym = line.split()
        assert (rc, st) == ("rc=0", "status=0"), line
        assert lib == "lib=librankguard.so", line
        key = (name, int(version), int(flags))
        if key in want:
            assert sym == f"sym={want[key]}", line
