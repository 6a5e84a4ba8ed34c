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
import re
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


def relocations(lib: pathlib.Path) -> list[tuple[int, str]]:
    """(offset, type) of every dynamic relocation."""
    out = subprocess.run(["readelf", "-r", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return [(int(f[0], 16), f[2]) for f in (l.split() for l in out.splitlines())
            if len(f) >= 3 and f[2].startswith("R_X86_64")]


def relocation_offsets(lib: pathlib.Path) -> list[int]:
    return [at for at, _ in relocations(lib)]


def relative_relocations(lib: pathlib.Path) -> int:
    return sum(1 for _, kind in relocations(lib) if kind == "R_X86_64_RELATIVE")


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
        assert "RANKGUARD DENY cuDeviceGet(" in p.stderr, (how, p.stderr)


def dynamic_flags(lib: pathlib.Path) -> str:
    return subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True,
                          check=True).stdout


def program_headers(lib: pathlib.Path) -> str:
    return subprocess.run(["readelf", "-l", "-W", str(lib)], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.parametrize("lib", BUILDS)
def test_libc_calls_are_bound_on_first_use_not_at_load(lib):
    # Each symbol bound at load is a lookup through the process's objects (~700 loader
    # instructions) at every process start, CUDA or not. The library's calls are bound on
    # first use (.cargo/config.toml relro-level=partial: calls through the PLT; build.rs
    # -z lazy), which a process that never touches CUDA never makes.
    dyn = dynamic_flags(lib)
    flags = [l for l in dyn.splitlines() if "(FLAGS" in l]
    assert flags and not any("NOW" in l for l in flags), flags
    # The data and the GOT stay read-only once relocated.
    assert "GNU_RELRO" in program_headers(lib)
    kinds: dict[str, set[str]] = {}
    for kind, _, name in symbol_relocations(lib):
        kinds.setdefault(name.split("@")[0], set()).add(kind)
    # Functions only the guard's own code calls (dlopen: majors.rs, real.rs; syscall: the
    # signal mask's and the sinks' system calls): a lazy PLT slot, never a load-time GOT
    # entry. getpid is no import at all: signal_safe::pid is the instruction itself.
    for f in ("dlopen", "dladdr", "syscall", "dl_iterate_phdr"):
        assert kinds.get(f) == {"R_X86_64_JUMP_SLOT"}, (f, kinds.get(f))
    assert "getpid" not in kinds, kinds.get("getpid")
    lazy = sum(1 for k in kinds.values() if k == {"R_X86_64_JUMP_SLOT"})
    assert lazy >= 30, f"only {lazy} of {len(kinds)} imports are bound lazily"


def dynamic_symbols(lib: pathlib.Path) -> dict[str, tuple[str, str]]:
    """name (without version) -> (type, binding) of every undefined dynamic symbol."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[6] == "UND" and f[7]:
            syms[f[7].split("@")[0]] = (f[3], f[4])
    return syms


# What stays bound at load (build.rs, LAZY_LIBC): std's weak references, which it tests for
# null before calling, so a stub that is never null cannot stand in for them, and data.
LOAD_TIME_WEAK = {"gettid", "statx", "__cxa_thread_atexit_impl"}
LOAD_TIME_DATA = {"stderr"}  # the unwinder's (libunwind's debug prints)


def load_time_lookups(lib: pathlib.Path) -> set[str]:
    return {name.split("@")[0] for kind, _, name in symbol_relocations(lib)
            if kind != "R_X86_64_JUMP_SLOT"}


@pytest.mark.parametrize("lib", BUILDS)
def test_no_function_is_looked_up_at_load_but_stds_weak_references(lib):
    # std's precompiled code calls malloc, free, memcpy, opendir, pthread_create... through
    # GOT entries, each a symbol lookup at every process start (52 in all at 2e8e1f2, ~2/3
    # of the guard's added start-up instructions). build.rs wraps each in a stub that jumps
    # through a lazy PLT slot; a function std starts calling that way fails here.
    syms = dynamic_symbols(lib)
    at_load = load_time_lookups(lib)
    unknown = sorted(n for n in at_load if n not in syms)
    assert not unknown, f"load-time relocations of symbols readelf --dyn-syms did not list: {unknown}"
    functions = sorted(n for n in at_load if syms[n] == ("FUNC", "GLOBAL"))
    assert not functions, (f"{len(functions)} functions looked up at every process start: {functions}; "
                           "add them to LAZY_LIBC in build.rs")
    weak = {n for n in at_load if syms[n][1] == "WEAK"}
    data = {n for n in at_load if syms[n][0] == "OBJECT"}
    assert weak <= LOAD_TIME_WEAK and data <= LOAD_TIME_DATA, (sorted(weak), sorted(data))
    assert at_load == weak | data, sorted(at_load - weak - data)


def bindings(lib: pathlib.Path, argv: list, **env: str) -> list[tuple[str, str]]:
    """(symbol, object it was bound to) for each binding the loader made for `lib`
    (LD_DEBUG=bindings), in order."""
    p = run(argv, env=clean_env(LD_PRELOAD=str(lib), LD_DEBUG="bindings", **env))
    out = []
    for line in p.stderr.splitlines():
        m = re.search(r"binding file (\S+) \[0\] to (\S+) \[0\]: normal symbol `([^']+)'", line)
        if m and pathlib.Path(m.group(1)).resolve() == lib.resolve():
            out.append((m.group(3), pathlib.Path(m.group(2)).name))
    return out


@pytest.mark.parametrize("lib", BUILDS)
def test_stds_libc_calls_bind_on_first_use_to_the_c_library(lib):
    # The loader's own account: /bin/true under the guard binds nothing of the library's
    # but what LOAD_TIME_* names; a refused call, which reads the configuration, allocates
    # and writes, and a first cuInit that records its rank (its GPU given in-process), which
    # opens the registry's directory for its start-up sweep, bind the C library's functions
    # then, to libc (the stubs reach the same functions the GOT held).
    at_start = {name for name, _ in bindings(lib, ["/bin/true"])}
    assert at_start, "LD_DEBUG=bindings printed nothing for the library: the parse is wrong"
    assert at_start <= LOAD_TIME_WEAK | LOAD_TIME_DATA, sorted(at_start - LOAD_TIME_WEAK - LOAD_TIME_DATA)
    used = dict(bindings(lib, [prog("guard_call"), "link", "cuDeviceGet", "1"],
                         CUDA_VISIBLE_DEVICES="3", RANKGUARD_MODE="enforce"))
    used.update(bindings(lib, [prog("guard_repoint"), "0"], CUDA_VISIBLE_DEVICES=None))
    for f in ("malloc", "free", "memcpy", "getenv", "opendir", "write"):
        assert used.get(f, "").startswith("libc.so"), (f, used.get(f), sorted(used))


@pytest.mark.parametrize("lib", BUILDS)
def test_the_guard_works_with_every_slot_bound_at_load(lib):
    # LD_BIND_NOW binds every lazy slot, the stubs' included, at start: each must resolve
    # in this glibc (a missing one fails the load with "symbol lookup error").
    env = clean_env(LD_PRELOAD=str(lib), LD_BIND_NOW="1", CUDA_VISIBLE_DEVICES="3", RANKGUARD_MODE="enforce")
    assert run(["/bin/true"], env=env).returncode == 0
    p = run([prog("guard_call"), "dlsym", "cuDeviceGet", "1"], env=env)
    assert "rc=101" in p.stdout and "RANKGUARD DENY cuDeviceGet(" in p.stderr, p.stdout + p.stderr


def table_entries() -> int:
    text = (pathlib.Path(__file__).resolve().parent.parent / "src" / "guard" / "2_table" / "generated.rs").read_text()
    m = re.search(r"pub static BY_ABI: \[u16; (\d+)\]", text)
    assert m, "generated.rs has no BY_ABI index (scripts/gen_guarded.py changed shape?)"
    return int(m.group(1))


def test_the_guarded_table_holds_no_pointers():
    # The table, its names and its indexes are offsets, not pointers: a pointer in a static
    # is a relocation the loader applies at every process start (docs/benchmarks.md,
    # figure 3), ~980 of them when the table held its names and wrappers as pointers. The
    # glibc 2.28 build keeps its symbol table (the 2.34 build's is stripped): no relocation
    # may fall inside the table's objects.
    syms = subprocess.run(["readelf", "-s", "-W", "-C", str(GUARD)], capture_output=True, text=True,
                          check=True).stdout
    objects = {}
    for line in syms.splitlines():
        f = line.split()
        if len(f) >= 8 and (f[7].startswith("rankguard::guard::table::") or f[7] == "rankguard_wrapper_offsets"):
            name = f[7].rsplit("::", 1)[-1]
            if name in ("TABLE", "NAMES", "NAME_AT", "BY_ABI", "DRIVER_APIS", "DRIVER_VARIANTS",
                        "rankguard_wrapper_offsets"):
                objects[name] = (int(f[1], 16), int(f[2], 0))
    assert len(objects) == 7, f"not all of the table's objects found in {GUARD.name}'s symbols: {sorted(objects)}"
    n = table_entries()
    assert objects["rankguard_wrapper_offsets"][1] == 4 * n, objects["rankguard_wrapper_offsets"]
    inside = []
    for at in relocation_offsets(GUARD):
        inside += [name for name, (start, size) in objects.items() if start <= at < start + size]
    assert not inside, f"relocations inside the table: {sorted(set(inside))} ({len(inside)})"


@pytest.mark.parametrize("lib", BUILDS)
def test_relative_relocations_do_not_grow_with_the_table(lib):
    # 2,561 relative relocations at 06cec78 with a 204-entry table (~4.8 per entry: names,
    # wrappers, indexes); the rest of the library has ~850. A bound of 5 per entry
    # fails as soon as the table's pointers come back.
    relative = relative_relocations(lib)
    n = table_entries()
    assert 0 < relative < 5 * n, f"{relative} relative relocations for a {n}-entry table"


def sections(lib: pathlib.Path) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of every section with an address."""
    out = subprocess.run(["readelf", "-S", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    secs = {}
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m and int(m.group(2), 16):
            secs[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16))
    return secs


@pytest.mark.parametrize("lib", BUILDS)
def test_no_relocation_writes_a_page_of_data_but_the_plt_slots(lib):
    # Each page a relocation lands on is a copy-on-write fault at every process start (~0.6%
    # of /bin/true's start-up each on the reference VM, docs/benchmarks.md "Written pages").
    # The lazy PLT slots' page is written anyway: a relocated static of `.data` (a pointer
    # in a mutable static: the sinks' texts, the dlsym trampoline's FORWARD, tracing's call
    # sites) elsewhere costs one more page. FORWARD has its own section, which lld places
    # next to `.got.plt`.
    secs = sections(lib)
    assert ".got.plt" in secs and ".data" in secs, sorted(secs)
    start, size = secs[".got.plt"]
    plt_pages = set(range(start >> 12, ((start + size - 1) >> 12) + 1))
    data = [secs[n] for n in (".data", ".rankguard_relocated") if n in secs]
    stray = sorted({hex(o) for o in relocation_offsets(lib)
                    if any(a <= o < a + z for a, z in data) and o >> 12 not in plt_pages})
    assert not stray, f"relocations in .data off the PLT slots' page(s) {sorted(map(hex, plt_pages))}: {stray}"


@pytest.mark.parametrize("lib", BUILDS)
def test_relocated_constants_stay_few(lib):
    # 852 relative relocations with `tracing` in the library (its call sites' metadata,
    # the subscriber's vtables and its dependencies' panic locations: ~400 of them, three
    # written pages); ~470 without (std's panic locations and vtables are most of the rest),
    # ~500 since the GOT entries of std's C calls point at the library's stubs (build.rs,
    # LAZY_LIBC: 48 relative relocations in place of 48 symbol lookups).
    relative = relative_relocations(lib)
    assert 0 < relative < 600, f"{relative} relative relocations (was ~470): what added pointers to statics?"


@pytest.mark.parametrize("lib", BUILDS)
def test_the_loader_writes_four_pages(lib):
    # The RELRO data (3 pages from a page boundary) and the last writable page (`.data`,
    # `.got.plt`): src/guard/1_sys/layout.rs aligns the starts of `.data.rel.ro` and `.data`, and
    # the guard's relocation-free arrays (the table's run-time slots, the pools' devices)
    # are zero-initialised, in `.bss`. 8 pages with `tracing` and a table in `.data`; 5
    # before the alignment.
    pages = sorted({o >> 12 for o in relocation_offsets(lib)})
    assert len(pages) <= 4, f"relocations write {len(pages)} pages: {[hex(p << 12) for p in pages]}"
    secs = sections(lib)
    assert secs[".data.rel.ro"][0] % 4096 == 0 and secs[".data"][0] % 4096 == 0, secs


# What the loader does for the library at every process start, CUDA or not, held at or below
# 1fbe238's counts (docs/benchmarks.md, "What the loader's added instructions are made of"): ~13
# loader instructions per relative relocation, ~15 per lazy PLT slot, and for each version of
# the C library the library needs, a walk of the C library's list of versions (~340 for
# `GLIBC_2.32`, which `pthread_sigmask` brought in). Between 1fbe238 and e5ce4df they crept
# up by 14, 7 and 1 with nobody noticing (+656 instructions of `/bin/true` in scripts/bench).
# A change that needs more pays for it here: remove as many elsewhere (a `{CONST}` in a
# format string is a promoted static holding a pointer: bind a local; an index or `join`
# keeps a panic location: `get`; a `match` returning string literals of different lengths,
# or an array of `&str` a loop walks, is a table of pointers: `rankguard_core::strtab`; a C
# function called once can be looked up then, `resolve::dl::lookup`, or be a system call,
# `sys::sigmask`, `sys::sigaction`).
# Raised once, at the merge of 2026-12-02's branches (+5 lazy slots of ending the rank's
# signal functions, +25 relative relocations of the map record, the end-rank lines and the
# DENY wording), and paid back since (the startup branch): the signal functions are system
# calls (`sys::sigaction`: 84 -> 79 slots), the rules' names and fixes, the modes' names, the
# map record's R1 outcome and the rank marks are `StrTable`s, two format constants are
# locals and ten indexes `get` (525 -> 487 relative relocations, 15 fewer than 1fbe238).
LOADER_WORK = {
    "glibc-2.28-build": (GUARD, {"R_X86_64_RELATIVE": 487, "R_X86_64_JUMP_SLOT": 79},
                         {("libc.so.6", v) for v in (
                             "GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.3.4", "GLIBC_2.9", "GLIBC_2.14",
                             "GLIBC_2.16", "GLIBC_2.17", "GLIBC_2.18", "GLIBC_2.28")}
                         | {("ld-linux-x86-64.so.2", "GLIBC_2.3"), ("libpthread.so.0", "GLIBC_2.2.5"),
                            ("libpthread.so.0", "GLIBC_2.12"), ("libdl.so.2", "GLIBC_2.2.5")}),
    "glibc-2.34-build": (NATIVE_GUARD, {"R_X86_64_RELATIVE": 487, "R_X86_64_JUMP_SLOT": 79},
                         {("libc.so.6", v) for v in (
                             "GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.3.2", "GLIBC_2.3.4", "GLIBC_2.9",
                             "GLIBC_2.14", "GLIBC_2.16", "GLIBC_2.17", "GLIBC_2.18", "GLIBC_2.28",
                             "GLIBC_2.30", "GLIBC_2.33", "GLIBC_2.34")}
                         | {("ld-linux-x86-64.so.2", "GLIBC_2.3")}),
}


def version_needs(lib: pathlib.Path) -> set[tuple[str, str]]:
    """(file, version) of every version the library needs of another object (.gnu.version_r)."""
    out = subprocess.run(["readelf", "-V", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    needs, file, inside = set(), None, False
    for line in out.splitlines():
        if "Version needs section" in line:
            inside = True
        elif inside and (m := re.search(r"File: (\S+)", line)):
            file = m.group(1)
        elif inside and file and (m := re.search(r"Name: (\S+)", line)):
            needs.add((file, m.group(1)))
    return needs


@pytest.mark.parametrize("build", sorted(LOADER_WORK))
def test_the_loaders_work_for_the_library_does_not_grow(build):
    lib, ceilings, versions = LOADER_WORK[build]
    kinds: dict[str, int] = {}
    for _, kind in relocations(lib):
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds.get("R_X86_64_RELATIVE", 0) > 100, f"readelf's relocations misparsed: {kinds}"
    needs = version_needs(lib)
    assert needs, "readelf -V listed no version needs: the parse is wrong"
    over = {k: (kinds.get(k, 0), most) for k, most in ceilings.items() if kinds.get(k, 0) > most}
    problems = ([f"more relocations than the caps, at most 1fbe238's (count, most): {over}"]
                if over else [])
    if needs - versions:
        problems.append(f"versions needed that 1fbe238 did not need: {sorted(needs - versions)}")
    assert not problems, f"{build}: " + "; ".join(problems)


@pytest.mark.parametrize("lib", BUILDS)
def test_the_only_load_time_code_is_stds_entry_and_the_narrowing_check(lib):
    # The loader runs the library's DT_INIT, DT_INIT_ARRAY and (at exit) DT_FINI_ARRAY code in
    # every process. Two entries: std's (it keeps argc/argv) and src/guard/7_decide/narrow.rs's
    # scan of envp for RANKGUARD_NARROW_BY; each is one more relative relocation and a call.
    dyn = dynamic_flags(lib)
    for tag in ("(INIT)", "(FINI)", "(FINI_ARRAY)", "(PREINIT_ARRAY)"):
        assert tag not in dyn, (tag, dyn)
    m = re.search(r"\(INIT_ARRAYSZ\)\s+(\d+)", dyn)
    assert m and int(m.group(1)) == 2 * 8, dyn
