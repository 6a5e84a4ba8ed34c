"""What every process under the guard pays to load librankguard.so (issue 17; docs/benchmarks.md
figure 3: start-up of /bin/true within 1.05x of an empty C preload on glibc 2.34+).

Most of the loader's extra work was symbol lookups: each relocation that names a symbol is
looked up through every object of the process. The guarded table points at the library's
own exported wrappers, ~70 such relocations that all resolved back to the library itself.
Linked with -Bsymbolic (build.rs), they are relative relocations (no lookup), and the only
symbol relocations left are the library's imports. Checked on both builds with readelf, so
it holds whatever the timing of the machine running the tests.
"""
from __future__ import annotations

import pathlib
import subprocess

import pytest

from conftest import GUARD, NATIVE_GUARD, clean_env, run
from _guard import prog

BUILDS = [pytest.param(GUARD, id="glibc-2.28-build"),
          # Always built (scripts/setup installs zig; test_two_builds.py fails without it):
          # a missing file fails here too rather than skipping.
          pytest.param(NATIVE_GUARD, id="glibc-2.34-build")]


def symbol_relocations(lib: pathlib.Path) -> list[tuple[str, int, str]]:
    """(type, symbol value, symbol name) of every dynamic relocation that names a symbol."""
    out = subprocess.run(["readelf", "-r", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    rels = []
    for line in out.splitlines():
        f = line.split()
        # Offset Info Type Sym.Value Sym.Name [+ Addend]
        if len(f) >= 5 and f[2].startswith("R_") and not f[4].startswith("+"):
            rels.append((f[2], int(f[3], 16), f[4]))
    return rels


@pytest.mark.parametrize("lib", BUILDS)
def test_no_relocation_binds_to_the_librarys_own_exports(lib):
    rels = symbol_relocations(lib)
    assert rels, "readelf found no symbol relocations at all: the parse is wrong"
    own = sorted({name for _, value, name in rels if value != 0})
    assert not own, f"{len(own)} symbols looked up at every process start though the library defines them: {own[:10]}"


@pytest.mark.parametrize("lib", BUILDS)
def test_the_table_still_hands_out_the_guards_wrappers(lib):
    # The pointers -Bsymbolic made relative are the guarded table's: dlsym of a guarded name
    # must still reach the guard (a refused ordinal, with the guard's line).
    env = clean_env(LD_PRELOAD=str(lib), CUDA_VISIBLE_DEVICES="3", RANKGUARD_MODE="enforce")
    for how in ("link", "dlsym", "gpa2"):
        p = run([prog("guard_call"), how, "cuDeviceGet", "1"], env=env)
        assert "rc=101" in p.stdout, (how, p.stdout + p.stderr)
        assert "RANKGUARD WARN cuDeviceGet(" in p.stderr, (how, p.stderr)
