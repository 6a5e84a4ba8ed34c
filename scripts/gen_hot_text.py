#!/usr/bin/env python3
"""Write src/guard/hot_text.ld: the linker script that gathers the code a guarded process runs
at its start and first `cuInit` into one output section, `.text.rankguard_hot`
(docs/benchmarks.md, "The first cuInit's text pages").

Why: each first touch of the library's text is a page fault that maps the pages around it
(the kernel's fault-around: the 64 KiB window's 16 pages; or a whole page-cache folio), and
the cost grows with the pages mapped (docs/benchmarks.md). Left where the
linker puts them, the ~50 KiB of code a first `cuInit` runs lie in 9 of the text's 10
windows, so the process maps all of it. The same script puts the small statics a first
`cuInit` writes on the page of the PLT slots (`HOT_STATICS`), which the loader writes anyway.

How: every scenario below runs under callgrind with the unstripped build
(target/release/librankguard.so); each function of the library that executed is named in
the script by its mangled name with the hash made a wildcard (rustc puts each function in a
section `.text.<symbol>`), so a rebuild with other hashes still matches. Scenarios come in
the order their code is placed; the `RANK`-set case (a launcher's rank, the common one)
comes last, next to the PLT that the linker places after the section.

Needs valgrind (scripts/setup installs it where it is missing). Run it after changing what
the start or the first cuInit runs; scripts/test runs `--check`, and python-tests/test_hot_text.py fails when
a named function of the first cuInit lies outside the section, when the script's patterns
go stale, or when a first cuInit maps half the text.

Usage: scripts/gen_hot_text.py [--check]   (--check: exit 1 if the script would change; a
first run that differs is said, with the lines, and the scenarios run once more)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "target" / "release" / "librankguard.so"
FAKE = ROOT / "c-tests" / "build" / "fakecuda"
BENCH = ROOT / "c-tests" / "build" / "bench"
OUT = ROOT / "src" / "guard" / "hot_text.ld"
PAD = {f"RG_HOT_PAD_{i:03d}": "x" * 1000 for i in range(66)}


def scenarios(reg: str, outs: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """(name, environment, argv) in placement order; the last is placed next to the PLT."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
            "LD_LIBRARY_PATH": str(FAKE), "FAKECUDA_GPUS": "2", "RANKGUARD_REGISTRY": reg, **PAD}
    py = ROOT / ".venv" / "bin" / "python3"
    prog = ("from cuda.bindings import driver as d; d.cuInit(0); d.cuDeviceGet(0); "
            "import ctypes; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0)")

    def under_sh(argv: list[str], preload_tree: bool) -> list[str]:
        # A parent shell: the walk's reads of an unguarded (or, exported, guarded) parent.
        cmd = "CUDA_VISIBLE_DEVICES=0 " + ("" if preload_tree else f"LD_PRELOAD={LIB} ") + \
              " ".join(argv)
        return ["/bin/sh", "-c", cmd]

    cg = lambda name: ["valgrind", "--tool=callgrind", "--demangle=no",  # noqa: E731
                       f"--callgrind-out-file={outs}/cg.{name}"]
    return [
        ("python", base, under_sh(cg("python") + [str(py), "-c", f'"{prog}"'], False)),
        ("runtime", base, under_sh(cg("runtime") + [str(BENCH / "bench_calls"), "rt-set", "10"], False)),
        ("exported", dict(base, LD_PRELOAD=str(LIB)),
         under_sh(cg("exported") + [str(BENCH / "bench_calls"), "drv-link", "10"], True)),
        ("no-rank", base, under_sh(cg("no-rank") + [str(BENCH / "bench_calls"), "drv-link", "10"], False)),
        ("rank", dict(base, RANK="0"), under_sh(cg("rank") + [str(BENCH / "bench_calls"), "drv-link", "10"], False)),
    ]


def executed(path: str) -> list[str]:
    """The library's functions that executed, in callgrind's order of first mention."""
    names: dict[str, None] = {}
    ob_names: dict[str, str] = {}
    fn_names: dict[str, str] = {}
    ob = ""
    for line in Path(path).read_text(errors="replace").splitlines():
        m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(3):
                ob_names[m.group(2)] = m.group(3)
            if m.group(1) == "ob":
                ob = ob_names.get(m.group(2), "")
            continue
        m = re.match(r"^fn=\((\d+)\)(?: (.*))?$", line)
        if m:
            if m.group(2):
                fn_names[m.group(1)] = m.group(2)
            # valgrind names no object for code in a section it does not know (the hot
            # section itself, once built): "???".
            if ob.endswith("/librankguard.so") or ob == "???":
                names.setdefault(re.sub(r"'\d+$", "", fn_names.get(m.group(1), "")), None)
            continue
        m = re.match(r"^c?fn=\((\d+)\) (.*)$", line)
        if m:
            fn_names[m.group(1)] = m.group(2)
    return [n for n in names if n in own_symbols()]


# The allocator shims (`__rust_alloc`, `__rust_realloc`, ...), by their v0-mangled names, and
# what runs only where the start block is found in memory, which under valgrind it is not
# (its initial stack is valgrind's): the scan of the start environment's definitions.
ALWAYS = re.compile(r"^_RNvCs[0-9A-Za-z]+_7___rustc\d+___rust_(alloc|dealloc|realloc|alloc_zeroed)$"
                    r"|^_ZN14rankguard_core7lineage10start_defs17h[0-9a-f]{16}E$")

_OWN: set[str] = set()


def own_symbols() -> set[str]:
    """The library's function symbols (`nm`), so that no other object's name is taken."""
    if not _OWN:
        out = subprocess.run(["nm", str(LIB)], capture_output=True, text=True, check=True).stdout
        _OWN.update(p[2] for p in (line.split() for line in out.splitlines())
                    if len(p) == 3 and p[1] in "tTwW")
    return _OWN


def pattern(sym: str) -> str | None:
    """The input-section patterns of a function: its section with the hash a wildcard."""
    if sym.startswith("__wrap_"):
        return None  # the lazy-libc stubs are placed as one group (render)
    if sym.startswith("_ZN"):
        sym = re.sub(r"17h[0-9a-f]{16}E$", "17h*", sym)   # legacy mangling: the hash
    elif sym.startswith("_R"):
        sym = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", sym)     # v0 mangling: crate disambiguators
    # LLVM numbers a function's local copies (`...kind.684`); another build numbers them
    # anew (adding code elsewhere moved three of them out of the section once): every copy.
    sym = re.sub(r"\.\d+$", ".*", sym)
    # `$` and the like are not plain pattern characters in every linker's script lexer.
    # A `#[cold]` function's section is `.text.unlikely.<symbol>` (LLVM's prefix).
    sym = re.sub(r"[^A-Za-z0-9_.*]", "?", sym)
    return f".text.{sym} .text.unlikely.{sym}"


# Found by `perf record -e page-faults -d` of figure 7's program: the statics whose first
# touch was a fault of its own page, and their small neighbours that the first cuInit
# touches next (each a few words). `SLOTS` (7 KiB) stays in `.bss`.
HOT_STATICS = [
    "_ZN9rankguard5guard7process5state5STATE17h*",
    "_ZN9rankguard5guard7process5state9OWNED_GPU17h*",
    "_ZN9rankguard5guard7process5state9START_GPU17h*",
    "_ZN9rankguard5guard7resolve2dl*",
    "_ZN9rankguard5guard3sys7libcsym*",
    "_ZN9rankguard5guard7resolve4real*",
    "_ZN9rankguard5guard7resolve6majors*",
    "_ZN9rankguard5guard7resolve8internal*",
    "_ZN9rankguard5guard6decide6narrow*",
    "_ZN9rankguard5guard7process9root_walk4ROOT17h*",
    "_ZN9rankguard5guard7process9root_walk12RECORD_OWNER17h*",
    "_ZN9rankguard5guard7process9root_walk9EXIT_HOOK17h*",
    "_ZN9rankguard5guard6decide7missing*",
    "_ZN9rankguard5guard6output*",
    "_ZN14rankguard_core8registry10NEW_WRITES17h*",
    # written at every start by the constructor (the image's owner, its initial stack) and
    # at the first cuInit (the start block found): on the page written anyway
    "_ZN9rankguard5guard7process7lineage9IMAGE_PID17h*",
    "_ZN9rankguard5guard3sys11start_block10SP_AT_LOAD17h*",
    "_ZN9rankguard5guard3sys11start_block8FOUND_AT17h*",
    "_ZN9rankguard5guard3sys11start_block9FOUND_END17h*",
    # the walk without rank variables: the registry's verdict cache and std's statx probe
    # (read, then written: two faults of their page), the owed record's and own start's words
    "_ZN14rankguard_core8registry10RECENT_DIR17h*",
    "_RNvNvNtNtNtCs*_3std3sys2fs4unix9try_statx17STATX_SAVED_STATE*",
    "_ZN9rankguard5guard7process9root_walk7OWED_BY17h*",
    "_ZN9rankguard5guard7process9root_walk4OWED17h*",
    "_ZN9rankguard5guard7process9root_walk9FORK_HOOK17h*",
    "_ZN9rankguard5guard7process9root_walk9OWN_START17h*",
    "_ZN9rankguard5guard7process9root_walk11RECORD_PATH17h*",
]


# The code every process runs when the loader initialises the library (its `.init_array`
# entries: the guard's constructor and std's), placed together at the section's end, next
# to the first cuInit's: by name (the groups' order) the two lay 39 KiB apart, so a load
# faulted two windows of the text in as often as not, and a process that never touches
# CUDA paid for both.
AT_LOAD = [f".text.{n} .text.unlikely.{n}" for n in (
    "_RNvNvNtNtNtNtCs*_3std3sys4args4unix3imp15ARGV_INIT_ARRAY12init_wrapper",
    "_ZN9rankguard5guard6decide6narrow7at_load17h*",
)]


# The C library's static part (`libc_nonshared.a`: `atexit`, `pthread_atfork`, ...), linked
# into the library from an archive whose members the system's compiler put in plain `.text`
# (zig's, in `.text.<name>`), so no function pattern names them: the walk without rank
# variables registers its exit and fork handlers through two of them, and before they
# joined its group the call to `pthread_atfork`, at the end of `.text`, faulted a window
# of its own. Matched by archive and member, in that group.
NONSHARED = ["*libc_nonshared.a:*(.text .text.*)"]


GENERATED = ROOT / "src" / "guard" / "8_hooks" / "generated.rs"
HOT_ENTRY = re.compile(r'^    (?:Driver|Runtime) \d+ "[^"]*" "[^"]*" same \w+ (?:symver "[^"]*" )?'
                       r'(?:fallback "([^"]*)" )?fn (\w+)\(.*?\|real\| hot ', re.M)


def hot_halves() -> list[str]:
    """The input-section patterns of every wrapper's hot half (`guarded_wrapper!`'s exported
    allowed path): its symbol, and the fallback export name a build without version nodes
    gives it."""
    pats = []
    for fb, ident in HOT_ENTRY.findall(GENERATED.read_text()):
        pats += [f".text.{n} .text.unlikely.{n}" for n in (ident, fb) if n]
    if len(pats) < 100:
        raise SystemExit(f"gen_hot_text: found only {len(pats)} hot halves in {GENERATED}")
    return pats


def render(groups: list[tuple[str, list[str]]]) -> str:
    lines = [
        "/* Generated by scripts/gen_hot_text.py: do not edit. The code a guarded process runs",
        "   at its start and first cuInit, gathered into one section so that a first cuInit maps",
        "   one or two 64 KiB windows of the library's text instead of nine, and the statics it",
        "   writes on the PLT slots' page (docs/benchmarks.md, \"The first cuInit's text pages\";",
        "   python-tests/test_hot_text.py). Patterns are mangled names with the hash a wildcard.",
        "   INSERT scripts: the default layout stays. */",
        "SECTIONS",
        "{",
        "  .text.rankguard_hot :",
        "  {",
    ]
    # Each function goes with the last scenario that runs it, so the last scenario's code
    # (the RANK-set first cuInit) lies together, next to the PLT.
    seen: set[str] = set()
    placed = []
    seen.update(AT_LOAD)
    for name, pats in reversed(groups):
        fresh = sorted(p for p in set(pats) if p not in seen)  # sorted: the same script each run
        seen.update(fresh)
        placed.append((name, fresh))
    # Every wrapper's hot half starts a 64-byte line, so that its ~30 bytes (the allowed
    # call's whole path) never straddle two: `cuDeviceGet`'s did, and cost a third of the
    # guard's added time a call (docs/benchmarks.md, "Allowed calls: a line each"). The hot halves no scenario runs
    # come first, before the start's and first cuInit's code and its 64 KiB windows.
    halves = hot_halves()
    # The wrappers' cold halves the scenarios run start a line too: a repeated violation is
    # counted there (`cuDeviceGet::cold`, figure 5), and where a regenerated script shifted
    # it by a few bytes, the count took ~0.8 ns more a call with the same instructions
    # (docs/benchmarks.md, "The seventeenth session's run").
    aligned = set(halves) | {p for _, pats in groups for p in pats
                             if re.search(r"8wrappers\d+\w+4cold17h", p)}
    rest = [p for p in halves if p not in seen]
    lines.append(f"    /* hot halves no scenario runs: {len(rest)} patterns, a line each */")
    for p in rest:
        lines += ["    . = ALIGN(64);", f"    *({p})"]
    for i, (name, fresh) in enumerate(reversed(placed)):
        if i >= len(placed) - 2:
            # The last scenario's code (~55 KiB) and the PLT after it in one 64 KiB window,
            # and the one before it (the walk without rank variables) in the window before:
            # a touch maps a window's pages, and this costs at most 128 KiB of file.
            lines.append("    . = ALIGN(0x10000);")
        lines.append(f"    /* {name}: {len(fresh)} functions */")
        for p in fresh:
            if p in aligned:
                lines.append("    . = ALIGN(64);")
            lines.append(f"    *({p})")
        if name == "no-rank":
            lines += ["    /* the C library's static part (NONSHARED) */"]
            lines += [f"    {p}" for p in NONSHARED]
    # 256-byte aligned: the two (under 256 bytes together) never straddle two pages.
    lines += ["    . = ALIGN(0x100);", "    /* at load */"]
    lines += [f"    *({p})" for p in AT_LOAD]
    # Every scenario runs the lazy-libc stubs: last, with the RANK-set code.
    lines += ["    *(.text.rankguard_lazy_libc.*)", "  }", "}", "INSERT AFTER .text;", ""]
    # The statics a first cuInit writes, right after the PLT slots (`.got.plt`), whose
    # page the loader writes at every start: they then cost no page fault of their own
    # (before: two pages, each faulted twice, read then written).
    lines += ["SECTIONS", "{", "  .bss.rankguard_hot (NOLOAD) :", "  {"]
    lines += [f"    *(.bss.{p})" for p in HOT_STATICS]
    lines += ["  }", "}", "INSERT BEFORE .bss;", ""]
    return "\n".join(lines)


def generate() -> str | None:
    """The script the scenarios give now; None when one failed (said on stderr)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as reg, tempfile.TemporaryDirectory() as outs:
        os.chmod(reg, 0o700)
        groups = []
        for name, env, argv in scenarios(reg, outs):
            # Each scenario starts from an empty registry, so that what it runs does not
            # depend on what the one before left.
            for f in Path(reg).iterdir():
                f.unlink()
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            out = Path(outs) / f"cg.{name}"
            if r.returncode != 0 or not out.exists():
                print(f"gen_hot_text: scenario {name} failed ({r.returncode}): {r.stderr[-2000:]}",
                      file=sys.stderr)
                return None
            pats = [p for p in map(pattern, executed(str(out))) if p]
            groups.append((name, pats))
    # What every first cuInit runs that callgrind does not name (under valgrind the
    # allocator shims call valgrind's malloc; the start block is not found): placed with the
    # last scenario's code.
    # `perf record -e exceptions:page_fault_user` of figure 7's program found `__rust_alloc`
    # mapping a 64 KiB window of `.text` of its own.
    always = [pattern(sym) for sym in sorted(own_symbols()) if ALWAYS.match(sym)]
    groups[-1] = (groups[-1][0], groups[-1][1] + [p for p in always if p])
    return render(groups)


def changed_lines(old: str, new: str) -> str:
    """The lines one script has and the other lacks, for a message."""
    a, b = old.splitlines(), new.splitlines()
    return "; ".join([f"-{x.strip()}" for x in a if x not in b] + [f"+{x.strip()}" for x in b if x not in a])


def main() -> int:
    check = "--check" in sys.argv[1:]
    if not LIB.exists():
        print(f"gen_hot_text: {LIB} is missing: run `cargo build --release` first", file=sys.stderr)
        return 2
    text = generate()
    if text is None:
        return 1
    if check:
        have = OUT.read_text() if OUT.exists() else ""
        if have != text:
            # A clean clone's CI once found the script stale where ten reruns in that clone
            # found it current: one run of the scenarios differed. Say what differed and ask
            # once more; stale only when a second run agrees that it is.
            print(f"gen_hot_text: a run of the scenarios differs from {OUT}: "
                  f"{changed_lines(have, text)[:2000]}; running them again", file=sys.stderr)
            text = generate()
            if text is None:
                return 1
        same = have == text
        print(f"gen_hot_text: {OUT} is {'current' if same else 'stale: rerun scripts/gen_hot_text.py'}")
        if not same:
            print(f"gen_hot_text: {changed_lines(have, text)[:2000]}", file=sys.stderr)
        return 0 if same else 1
    OUT.write_text(text)
    print(f"gen_hot_text: wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
