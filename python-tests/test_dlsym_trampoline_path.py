"""How many instructions the guard's `dlsym` trampoline adds to a lookup (issue 17: a name
starting "cu" that cannot be guarded, such as libcurl's `curl_easy_init`, cuBLAS's
`cublasCreate_v2` and cuDNN's `cudnnCreate`, costs at most +10 instructions; callgrind
counts them in scripts/bench, figure 2, where valgrind is installed).

Without valgrind, the trampoline's own code is read back from the built libraries
(`objdump -d`) and followed for each name, byte compare by byte compare, until it jumps to
the real `dlsym` (through `FORWARD`) or leaves for the slow path (a jump out of the
function): the instructions followed are exactly what the lookup adds. Any instruction
this walk does not know fails the test: the trampoline then reads more than the name's
bytes (a table, a register), and this test and the figure need a look.
"""
from __future__ import annotations

import platform
import re
import subprocess

import pytest

from conftest import GUARD, NATIVE_GUARD

# The walk reads x86_64 machine code; the aarch64 trampoline is other code. On every
# architecture test_dlsym_names.py still checks, by real lookups, which names the trampoline
# forwards and which it hands to the guard. CI runs on x86_64, where this file runs.
pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="reads x86_64 machine code; test_dlsym_names.py covers the "
                                       "trampoline's behaviour on this architecture")

# What the issue names, and the other libraries' prefixes of its kind: "cu" then a lower-case
# letter (NVIDIA's math libraries, libcurl, CUB, CUTLASS).
CU_LIBRARIES = ["curl_easy_init", "cublasCreate_v2", "cudnnCreate", "cufftPlan1d", "curandCreate",
                "cusparseCreate", "cusolverDnCreate", "cutensorCreate", "cublasLtCreate", "cudnn"]
# Rarer shapes that cannot be guarded either: "cu" then a digit, '_' or the end; "cuda" then
# anything but a capital. They are compared further (at most six compares of five bytes).
CU_OTHER = ["cuda_probe", "cudaz", "cuda0", "cuda", "cud", "cu0", "cu_x", "cu"]
GUARDED_SHAPE = ["cuInit", "cuDeviceGet", "cudaSetDevice", "cuX", "cudaX"]
PLAIN = ["strlen", "PyInit_foo", "bench_plain_symbol", ""]


def trampoline(lib) -> tuple[int, int, list[tuple[int, str, str]]]:
    """(start, end, [(address, mnemonic, operands)]) of `dlsym` in `lib`."""
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    start = next(int(a, 16) for a, _, n in (l.split() for l in syms.splitlines() if len(l.split()) == 3)
                 if n == "dlsym")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start:#x}",
                          f"--stop-address={start + 256:#x}", str(lib)],
                         capture_output=True, text=True, check=True).stdout
    code = []
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m:
            if m.group(2) == "int3":  # the padding after the function
                break
            code.append((int(m.group(1), 16), m.group(2), m.group(3).split("#")[0].strip()))
    assert code, out
    end = code[-1][0] + 1
    return start, end, code


def walk(lib_code, name: str) -> tuple[str, int]:
    """Follow the trampoline for `name`: ("forward" | "slow", instructions executed)."""
    way, n, _ = walk_taken(lib_code, name)
    return way, n


def walk_taken(lib_code, name: str) -> tuple[str, int, int]:
    """`walk`, and how many conditional or direct jumps were taken on the way (a taken
    branch costs the front end more than one that falls through)."""
    start, end, code = lib_code
    taken_n = 0
    at = {a: i for i, (a, _, _) in enumerate(code)}
    data = name.encode() + b"\0"
    flags = None  # (byte, immediate) of the last compare
    pc, n = start, 0
    for _ in range(100):
        if not start <= pc < end:
            return "slow", n, taken_n
        _, op, args = code[at[pc]]
        n += 1
        m = re.fullmatch(r"cmp([bw])\s+\$0x([0-9a-f]+),(?:0x([0-9a-f]+))?\(%rsi\)", args and f"{op} {args}")
        if m:
            off = int(m.group(3) or "0", 16)
            width = 2 if m.group(1) == "w" else 1
            # Every byte read must lie inside the name or be its NUL: a read past the string
            # could cross into an unmapped page.
            assert off + width <= len(data), f"{name!r}: bytes {off}..{off + width - 1} read past the NUL"
            value = int.from_bytes(data[off:off + width], "little")
            flags = (value, int(m.group(2), 16))
            pc = code[at[pc] + 1][0]
            continue
        if op == "jmp" and args.startswith("*") and "(%rip)" in args:
            return "forward", n, taken_n
        target = re.fullmatch(r"([0-9a-f]+)(?: <.*>)?", args)
        if op in ("jmp", "je", "jne", "ja", "jae", "jb", "jbe") and target:
            b, imm = flags if flags else (0, 0)
            taken = {"jmp": True, "je": b == imm, "jne": b != imm, "ja": b > imm, "jae": b >= imm,
                     "jb": b < imm, "jbe": b <= imm}[op]
            taken_n += taken
            nxt = at[pc] + 1
            pc = int(target.group(1), 16) if taken else (code[nxt][0] if nxt < len(code) else end)
            continue
        pytest.fail(f"the trampoline has an instruction this walk does not know: {op} {args}")
    pytest.fail(f"{name!r}: no way out of the trampoline in 100 instructions")


def guarded_shape(name: str) -> bool:
    b = name.encode()
    upper = lambda i: i < len(b) and 65 <= b[i] <= 90  # noqa: E731
    return b[:2] == b"cu" and (upper(2) or (b[2:4] == b"da" and upper(4)))


@pytest.fixture(scope="module", params=["glibc-2.28 build", "glibc-2.34 build"])
def code(request):
    lib = GUARD if request.param == "glibc-2.28 build" else NATIVE_GUARD
    assert lib.exists(), f"{lib} is missing: cargo build --release"
    return trampoline(lib)


def test_library_names_starting_cu_add_at_most_ten_instructions(code):
    for name in CU_LIBRARIES:
        way, n = walk(code, name)
        assert way == "forward", name
        assert n <= 10, (name, n)
    # The three the issue names: 9 each (libcurl's and cuBLAS's leave at byte 2, cuDNN's at
    # byte 3).
    assert [walk(code, n)[1] for n in ("curl_easy_init", "cublasCreate_v2", "cudnnCreate")] == [9, 9, 9]


def test_library_names_starting_cu_fall_through_to_the_real_dlsym(code):
    # Each way out has its own jump to the real dlsym, and the names of NVIDIA's libraries
    # and libcurl take no branch before it (a shared jump cost one more each; testing byte
    # 2 for 'd' on its own cost cuDNN's names one).
    for name in CU_LIBRARIES:
        assert walk_taken(code, name)[2] == 0, name


def test_other_names_starting_cu_are_forwarded_within_fourteen(code):
    for name in CU_OTHER:
        way, n = walk(code, name)
        assert way == "forward" and n <= 14, (name, way, n)


def test_names_not_starting_with_c_add_three_instructions(code):
    for name in PLAIN:
        assert walk(code, name) == ("forward", 3), name


def test_exactly_the_guarded_shape_takes_the_slow_path(code):
    for name in GUARDED_SHAPE + CU_LIBRARIES + CU_OTHER + PLAIN:
        assert (walk(code, name)[0] == "slow") == guarded_shape(name), name
    # Every byte at positions 2 and 4 after a matching prefix.
    for prefix in ("cu", "cuda"):
        for b in range(1, 128):
            name = prefix + chr(b) + "x"
            assert (walk(code, name)[0] == "slow") == guarded_shape(name), repr(name)
