"""The first cuInit's code lies together (issue 33, figure 7; docs/benchmarks.md, "The first
cuInit's text pages").

A first touch of the library's text maps the pages around it (the kernel's fault-around, or
the whole page-cache folio), and each page mapped costs a guarded process time at its start.
src/guard/hot_text.ld (written by scripts/gen_hot_text.py from callgrind runs) gathers the
functions that a guarded process runs at its load and first `cuInit` into the section
`.text.rankguard_hot`. These tests hold the layout (the functions named below are in the
section, and the script's patterns still name the library's functions) and its effect (a
first `cuInit` leaves fewer than half of the text's pages mapped; 157 of 157 before). The
same script puts the statics a first `cuInit` writes on the PLT slots' page.
"""
from __future__ import annotations

import fnmatch
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import FAKE, GUARD, NATIVE_GUARD, ROOT, clean_env, run
from _guard import prog
from test_startup_cost import sections

SCRIPT = ROOT / "src" / "guard" / "hot_text.ld"

# Functions each first cuInit runs (the RANK-set case and the walk without rank variables)
# and at the library's load: demangled name prefixes, as `nm -C` prints them.
FIRST_INIT = [
    "cuInit",
    "cuDeviceGet",
    "rankguard::guard::decide::narrow::at_load",
    "rankguard::guard::process::state::init",
    "rankguard::guard::resolve::real::resolve_slot",
    "rankguard::guard::resolve::real::find",
    "rankguard::guard::process::root_walk::ensure_at_init",
    "rankguard::guard::process::root_walk::scan_environ_file",
    "rankguard::guard::process::driver_query::device_uuid",
    "rankguard_core::config::Config::from_lookup",
    "rankguard_core::rankgpu::decide",
    "rankguard_core::registry::Registry::write_probed",
]


def functions(lib, demangle: bool, kinds: str = "tTwW") -> dict[str, list[int]]:
    """name -> addresses of the library's symbols of the `nm` kinds given (functions by
    default; the unstripped build's)."""
    out = subprocess.run(["nm", *(["-C"] if demangle else []), str(lib)], capture_output=True,
                         text=True, check=True).stdout
    names: dict[str, list[int]] = {}
    for line in out.splitlines():
        p = line.split(" ", 2)
        if len(p) == 3 and p[0] and p[1] in kinds:
            names.setdefault(p[2], []).append(int(p[0], 16))
    return names


def test_the_first_cuinits_functions_are_in_the_hot_section():
    secs = sections(GUARD)
    assert ".text.rankguard_hot" in secs, \
        f"{GUARD} has no .text.rankguard_hot: build.rs did not link with {SCRIPT}"
    lo, size = secs[".text.rankguard_hot"]
    names = functions(GUARD, demangle=True)
    outside = []
    for want in FIRST_INIT:
        addrs = [a for n, v in names.items() if n == want or n.startswith(want + "::")
                 or n.startswith(want + "<") for a in v]
        assert addrs, f"no function {want} in {GUARD}: renamed? update FIRST_INIT"
        outside += [f"{want} at {a:#x}" for a in addrs if not lo <= a < lo + size]
    assert not outside, (f"outside .text.rankguard_hot [{lo:#x}, {lo + size:#x}): {outside}; "
                         "rerun scripts/gen_hot_text.py")


def test_the_scripts_patterns_name_the_librarys_functions():
    # A pattern that matches nothing is no link error: a rename makes the script stale
    # silently. Every pattern but a few (code a later change dropped) must still match.
    pats = re.findall(r"\*\(\.text\.(\S+) \.text\.unlikely\.\S+\)", SCRIPT.read_text())
    assert len(pats) > 50, f"{SCRIPT}: {len(pats)} patterns: the parse is wrong"
    names = list(functions(GUARD, demangle=False))
    # The script writes characters other than [A-Za-z0-9_.*] as `?`.
    stale = [p for p in pats if not fnmatch.filter(names, p)]
    assert len(stale) <= len(pats) // 20, \
        f"{len(stale)} of {len(pats)} patterns match no function: rerun scripts/gen_hot_text.py: {stale[:10]}"


@pytest.mark.parametrize("lib", [pytest.param(GUARD, id="glibc-2.28-build"),
                                 pytest.param(NATIVE_GUARD, id="glibc-2.34-build")])
@pytest.mark.parametrize("rank", ["0", None], ids=["RANK-set", "no-rank-variables"])
def test_a_first_cuinit_maps_less_than_half_the_text(lib, rank, tmp_path):
    # hot_pages runs scripts/bench's figure 7 program, then lists the present pages of the
    # library's executable mapping. How many a touch maps depends on the page cache's folio
    # sizes, so the bound is loose: before the section, every one of the text's pages was
    # mapped (157 of 157; 28-43 with it, docs/benchmarks.md).
    # Drop the file's pages from the page cache first, so that the run maps pages of the
    # folios a read of the file makes (as a library installed long ago is), not of those
    # the linker's write left. The folios that read makes depend on the machine's memory at
    # that moment (a clean clone's CI once mapped 94 of 176 pages where the same build maps
    # 33-47 on an idle machine): the fewest of up to three runs is the layout's figure.
    # The run preloads a private copy: other tests read the build's own file in parallel
    # (objdump, nm), and a whole-file read fills the page cache with large folios, which a
    # fault maps whole (a clean clone's CI mapped 94 pages three times running that way).
    secs = sections(lib)
    text_pages = sum((secs[n][1] + 4095) // 4096 for n in (".text", ".text.rankguard_hot", ".plt"))
    lib = pathlib.Path(shutil.copy(lib, tmp_path / lib.name))
    counts = []
    for attempt in range(3):
        fd = os.open(lib, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        reg = tmp_path / f"reg{attempt}"
        reg.mkdir(mode=0o700)
        p = run([prog("hot_pages")], env=clean_env(LD_PRELOAD=str(lib), LD_LIBRARY_PATH=str(FAKE),
                                                   FAKECUDA_GPUS="2", CUDA_VISIBLE_DEVICES="0",
                                                   RANK=rank, RANKGUARD_REGISTRY=str(reg)))
        assert p.returncode == 0 and p.stdout.endswith("done\n"), p.stdout + p.stderr
        present = [int(x, 16) for x in re.findall(r"^present (0x[0-9a-f]+)$", p.stdout, re.M)]
        assert present, p.stdout
        counts.append(len(present))
        if len(present) < text_pages // 2:
            break
    assert min(counts) < text_pages // 2, \
        f"{counts} of the text's {text_pages} pages mapped after a first cuInit"


@pytest.mark.parametrize("lib", [pytest.param(GUARD, id="glibc-2.28-build"),
                                 pytest.param(NATIVE_GUARD, id="glibc-2.34-build")])
def test_the_first_cuinits_statics_share_the_plt_slots_page(lib):
    # The loader writes .got.plt's page at every start; the statics a first cuInit writes
    # lie on it too, so they cost no page fault of their own (two pages, four faults before).
    secs = sections(lib)
    assert ".bss.rankguard_hot" in secs, f"{lib} has no .bss.rankguard_hot: linked without {SCRIPT}"
    got, got_size = secs[".got.plt"]
    hot, hot_size = secs[".bss.rankguard_hot"]
    assert got >> 12 == hot >> 12 == (hot + hot_size - 1) >> 12, \
        f".bss.rankguard_hot [{hot:#x}, {hot + hot_size:#x}) is not on .got.plt's page {got:#x}"
    if lib == GUARD:  # the unstripped build names them
        names = functions(lib, demangle=True, kinds="bBdD")
        for want in ("rankguard::guard::process::state::STATE", "rankguard::guard::resolve::dl::DRIVER",
                     "rankguard::guard::sys::libcsym::LINKED_STATE"):
            addrs = names.get(want, [])
            assert addrs and all(hot <= a < hot + hot_size for a in addrs), (want, [hex(a) for a in addrs])



def test_what_a_load_runs_lies_on_one_page():
    """The library's two `.init_array` entries (its constructor and std's), which every
    process runs at its load, lie together on one page of the hot section, next to the
    first cuInit's code: by name they lay 39 KiB apart, and a process that never touches
    CUDA faulted two windows of the text in as often as not."""
    lo, size = sections(GUARD)[".text.rankguard_hot"]
    names = functions(GUARD, demangle=True)
    at = {}
    for want in ("rankguard::guard::decide::narrow::at_load",
                 "std::sys::args::unix::imp::ARGV_INIT_ARRAY::init_wrapper"):
        addrs = [a for n, v in names.items() if n == want for a in v]
        assert len(addrs) == 1 and lo <= addrs[0] < lo + size, (want, [hex(a) for a in addrs])
        at[want] = addrs[0]
    a, b = sorted(at.values())
    # at_load, the second, is under 256 bytes: the page of its end is that of b + 0xff
    assert a >> 12 == (b + 0xff) >> 12, \
        f"the load's functions at {a:#x} and {b:#x}: not on one page; rerun scripts/gen_hot_text.py"


@pytest.mark.parametrize("lib", [pytest.param(GUARD, id="glibc-2.28-build"),
                                 pytest.param(NATIVE_GUARD, id="glibc-2.34-build")])
def test_the_c_librarys_static_part_lies_in_the_section(lib):
    """`atexit` and `pthread_atfork` are linked into the library from `libc_nonshared.a`
    (each a jump to libc's `__cxa_atexit` / `__register_atfork` with the library's
    `__dso_handle`), whose members the system's compiler left in plain `.text`: no function
    pattern names them, and the walk without rank variables, which registers its exit and
    fork handlers through them, faulted a 64 KiB window of `.text` for `pthread_atfork`
    alone. gen_hot_text.py places the archive's members in the walk's group (`NONSHARED`)."""
    lo, size = sections(lib)[".text.rankguard_hot"]
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)],
                         capture_output=True, text=True, check=True).stdout
    stubs = [int(a, 16) for a in re.findall(
        r"^\s*([0-9a-f]+):\s+jmp\s+[0-9a-f]+ <(?:__cxa_atexit|__register_atfork)@plt>$", out, re.M)]
    # atexit's in both builds (zig's glibc 2.28 takes pthread_atfork from libpthread.so.0)
    assert stubs, f"no jump to __cxa_atexit@plt or __register_atfork@plt in {lib}"
    outside = [hex(a) for a in stubs if not lo <= a < lo + size]
    assert not outside, (f"libc_nonshared.a's stubs at {outside}, outside .text.rankguard_hot "
                         f"[{lo:#x}, {lo + size:#x}): rerun scripts/gen_hot_text.py")


def frames(lib, section: str) -> dict[str, int]:
    """Each function of `section` and the bytes its prologue takes off the stack pointer
    (its `sub $N,%rsp` instructions, summed: a frame past 4 KiB is taken a page at a time,
    each page probed)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-j", section, str(lib)],
                         capture_output=True, text=True, check=True).stdout
    sizes: dict[str, int] = {}
    fn = None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            fn = m.group(1)
            sizes[fn] = 0
            continue
        m = re.search(r"\bsub\s+\$0x([0-9a-f]+),%rsp", line)
        if m and fn:
            sizes[fn] += int(m.group(1), 16)
    return sizes


def test_no_first_cuinit_function_probes_the_stack():
    """No function of the hot section (what a load and a first cuInit run) takes 4 KiB or
    more of stack: its probes touch every page of the frame, and the pages below what the
    program had used fault at every first cuInit (docs/benchmarks.md, "The R1 check's
    frame": the R1 check's frame was 10,008 bytes, the map record's buffers inlined into it,
    one more stack fault than the unguarded program takes)."""
    sizes = frames(GUARD, ".text.rankguard_hot")
    assert len(sizes) > 100, f"{len(sizes)} functions in {GUARD}'s hot section"
    big = {f: n for f, n in sizes.items() if n >= 4096}
    assert not big, big


def test_the_wrappers_cold_halves_in_the_section_start_a_line():
    """A repeated violation is counted in the wrapper's cold half (`cuDeviceGet::cold` for
    figure 5's `cuDeviceGet(1)`), ~110 instructions a call. Where a regenerated script moved
    that function by a few bytes inside a 64-byte line, the count took ~0.8 ns more a call
    with the same instructions (docs/benchmarks.md, "The seventeenth session's run"), so
    gen_hot_text.py starts each cold half the scenarios run on a line, as it does the hot
    halves."""
    lo, size = sections(GUARD)[".text.rankguard_hot"]
    names = functions(GUARD, demangle=True)
    cold = {n: a for n, v in names.items() for a in v
            if n.startswith("rankguard::guard::hooks::wrappers::") and n.endswith("::cold")
            and lo <= a < lo + size}
    assert "rankguard::guard::hooks::wrappers::cuDeviceGet::cold" in cold, sorted(cold)[:10]
    off = {n: hex(a) for n, a in cold.items() if a % 64}
    assert not off, f"cold halves not on a 64-byte line: {off}; rerun scripts/gen_hot_text.py"
