"""The allowed path of a guarded call, as the machine code of librankguard.so has it.

A wrapper whose check is a pure condition on its arguments (`hot { .. }` in
src/guard/8_hooks/generated.rs) is two functions (`guarded_wrapper!`, wrappers.rs): the
exported hot half loads the published real function, tests the condition and jumps to the
real function; everything else jumps to the cold half. These tests read the built
library's code (objdump) and hold the line that docs/benchmarks.md, "Allowed calls: the
hot half", explains:

- the hot half never *calls* its cold half: it jumps there, so the return address in the
  cold half's frame is the program's call site (call-site capture, the repeated-violation
  key); a `call` would key every violation of the wrapper to one site inside ourselves;
- the hot half of a check that is pure arithmetic on its arguments (ordinal, query,
  ordinal_or_host, location) calls nothing at all and ends the allowed path with a jump to
  the real function: no frame beyond the frame pointer's, no spilled argument.
"""
import re
import shutil
import subprocess

import pytest

from conftest import GUARD, NATIVE_GUARD, ROOT

GENERATED = ROOT / "src" / "guard" / "8_hooks" / "generated.rs"
ENTRY = re.compile(r"^    (Driver|Runtime) .*? fn (\w+)\((.*?)\) -> \w+ \|real\| (hot )?", re.M)
KIND = re.compile(r"^    // .*?: (\w+)", re.M)
PURE = {"ordinal", "ordinal_or_host", "query", "location"}


def entries():
    """(ident, kind, has a hot half) of every generated wrapper, in order."""
    text = GENERATED.read_text()
    kinds = KIND.findall(text)
    found = [(m.group(2), m.group(4) is not None, m.group(3).count(":"))
             for m in ENTRY.finditer(text)]
    assert len(kinds) == len(found) > 200, (len(kinds), len(found))
    return [(ident, kind, hot, nargs) for (ident, hot, nargs), kind in zip(found, kinds)]


def disassembly(lib):
    """{function name: [(mnemonic, operands)]} of the library's text, each function under
    every name the symbol table gives its address (a runtime wrapper has several)."""
    for tool in ("objdump", "nm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} (binutils) is missing: gcc's own binutils provide it")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    by_addr, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.+)>:$", line)
        if m:
            cur = by_addr.setdefault(int(m.group(1), 16), [])
            continue
        m = re.match(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$", line)
        if m and cur is not None:
            cur.append((m.group(1), m.group(2)))
    # The stripped glibc-2.34 build has only its dynamic symbols: the exported wrappers.
    syms = "".join(subprocess.run(["nm", *flag, str(lib)], capture_output=True, text=True,
                                  timeout=60).stdout for flag in ([], ["-D"]))
    funcs = {}
    for line in syms.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT" and int(parts[0], 16) in by_addr:
            funcs[parts[2]] = by_addr[int(parts[0], 16)]
    return funcs


BUILDS = [GUARD] + ([NATIVE_GUARD] if NATIVE_GUARD.exists() else [])


@pytest.fixture(scope="module", params=BUILDS, ids=lambda p: p.parent.name)
def code(request):
    return disassembly(request.param)


def hot_half(code, ident):
    body = code.get(ident)
    assert body, f"{ident}: no such function in the library (not exported under its own name?)"
    # The stripped build labels only exported functions, and the hot section
    # (src/guard/hot_text.ld) puts unexported ones after some of them: a body ends at the
    # linker's fill between functions (int3) or at the next function's frame-pointer
    # prologue (every function has one: force-frame-pointers).
    for i, (op, args) in enumerate(body):
        if op == "int3" or (i > 0 and op == "push" and args == "%rbp"):
            body = body[:i]
            break
    # Up to the padding the assembler puts after the last instruction.
    while body and body[-1][0] in ("int3", "nop", "nopw", "nopl", "cs", "xchg"):
        body = body[:-1]
    return body


def test_every_check_that_is_a_condition_has_a_hot_half():
    missing = [i for i, kind, hot, _ in entries() if kind not in ("hook", "access") and not hot]
    assert not missing, f"wrappers with a pure check but no hot half: {missing}"
    assert sum(hot for _, _, hot, _ in entries()) >= 100


def test_the_hot_half_jumps_to_its_cold_half_never_calls_it(code):
    bad = []
    for ident, _, hot, _ in entries():
        if not hot:
            continue
        for op, args in hot_half(code, ident):
            if "4cold" in args and "cold" in args and not op.startswith("j"):
                bad.append(f"{ident}: {op} {args}")
    assert not bad, "a hot half that calls its cold half keys every violation to itself:\n" + "\n".join(bad)


def test_a_pure_checks_allowed_path_calls_nothing_and_jumps_to_the_real_function(code):
    bad = []
    sizes = []
    for ident, kind, hot, nargs in entries():
        # Past six integer arguments the rest travel on the stack, and LLVM calls the real
        # function instead of jumping to it (cuMulticastBindMem_v2, 7): still no frame of
        # its own beyond that call's, and the cold half is still reached by a jump.
        if not hot or kind not in PURE or nargs > 6:
            continue
        body = hot_half(code, ident)
        calls = [f"{op} {args}" for op, args in body if op.startswith("call")]
        if calls:
            bad.append(f"{ident} ({kind}): {calls}")
        if not any(op.startswith("jmp") and args.startswith("*") for op, args in body):
            bad.append(f"{ident} ({kind}): no tail jump to the real function")
        sizes.append((len(body), ident))
    assert not bad, "\n".join(bad)
    # The whole hot half of the simplest checks: frame pointer in and out, the load, the
    # condition, two jumps. A spilled argument or saved registers would show here first.
    assert max(n for n, i in sizes if i == "cuDeviceGet") <= 12, sizes


@pytest.mark.parametrize("lib", BUILDS, ids=lambda p: p.parent.name)
def test_every_hot_half_starts_a_cache_line(lib):
    """The allowed call is the hot half's ~30 bytes: where they straddle two 64-byte lines
    the call costs more at the same instructions (docs/benchmarks.md, "Allowed calls: a line
    each"); src/guard/hot_text.ld (scripts/gen_hot_text.py) starts each on a line."""
    out = "".join(subprocess.run(["nm", *flag, "--defined-only", str(lib)], check=True,
                                 capture_output=True, text=True, timeout=60).stdout
                  for flag in ([], ["-D"]))
    addr = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT":
            addr[parts[2]] = int(parts[0], 16)
    # Each hot half under its own symbol (`#[no_mangle]`, the ident: both builds define the
    # runtime majors' version nodes, so a runtime wrapper's symbol is its ident too); the
    # stripped build's runtime wrappers are found by their versioned names.
    found, bad = 0, []
    for ident, _, hot, _ in entries():
        if not hot:
            continue
        names = [n for n in addr if n == ident or (
            ident.endswith(("_cu12", "_cu13"))
            and n == f"{ident[:-5]}@{'@' if ident.endswith('13') else ''}libcudart.so.{ident[-2:]}")]
        found += bool(names)
        bad += [f"{n} at {addr[n]:#x}" for n in names if addr[n] % 64]
    assert found >= 100, found
    assert not bad, "hot halves that do not start a 64-byte line:\n" + "\n".join(bad)
