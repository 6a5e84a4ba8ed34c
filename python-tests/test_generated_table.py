"""The guarded table is generated, not hand-kept (issue 18): src/guard/8_hooks/generated.rs, the path
matrices (python-tests/_guarded.py, c-tests/include/guarded.h) and the README's contract
table are what scripts/gen_guarded.py writes from src/guard/2_table/guarded.spec and NVIDIA's
headers of every supported major (12.9 and 13.x, installed by scripts/setup); so are the lists
beside the table (issue 30): exec's names and shims, the guard's own calls, the CLI's driver
calls.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN = os.path.join(ROOT, "scripts", "gen_guarded.py")
INCLUDES = [os.path.join(ROOT, "c-tests", "build", d) for d in ("cuda-include", "cuda13-include")]


def _load():
    spec = importlib.util.spec_from_file_location("gen_guarded", GEN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_guarded"] = mod      # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


gen = _load()


def test_both_header_sets_are_installed():
    for d in INCLUDES:
        assert os.path.isfile(os.path.join(d, "cudaTypedefs.h")), f"{d}: run scripts/setup"
    majors = [gen.Headers.load(d).major for d in INCLUDES]
    assert majors == [12, 13]


def test_generated_files_are_current():
    """Regenerate everything and diff: fails when the spec, a header or an output was edited
    without the others (README's contract table included)."""
    r = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_readme_that_disagrees_is_caught(tmp_path, monkeypatch):
    """Control for the check above: a README whose contract table lost a call (or names one
    the table does not have) is not what the generator writes."""
    with open(gen.README, encoding="utf-8") as f:
        readme = f.read()
    assert gen.generate(INCLUDES)[gen.README] == readme
    for old, new in [("`cudaInitDevice`, ", ""),
                     ("`cuDeviceGet` |", "`cuDeviceGet`, `cuDeviceGetCount` |")]:
        assert old in readme
        tampered = tmp_path / "README.md"
        tampered.write_text(readme.replace(old, new, 1))
        monkeypatch.setattr(gen, "README", str(tampered))
        assert gen.generate(INCLUDES)[str(tampered)] == readme


ITEM_RE = re.compile(r'^    (Driver|Runtime) (\d+) "(\w+)" "(\w+)" same (true|false)(?: symver "([^"]*)")?'
                     r'(?: fallback "\w+")? fn (\w+)\((.*?)\) -> \w+ \|real\| (?:hot \{.*?\} \{|hot \{|\{)$', re.M)


def _wrappers_in(rs: str):
    """{ident: (lib, api, [(name, rust type)])} of the generated `guarded!` items; checks
    each runtime wrapper is defined under its own major's version node."""
    out = {}
    for m in ITEM_RE.finditer(rs):
        lib, major, api, abi, _, symver, ident, params = m.groups()
        if lib == "Runtime":
            assert symver in (f"{abi}@libcudart.so.{major}", f"{abi}@@libcudart.so.{major}"), m.group(0)
        else:
            assert major == "0" and symver is None, m.group(0)
        out[ident] = (lib, api, [tuple(p.split(": ", 1)) for p in params.split(", ") if p])
    assert len(out) == rs.count("|real| "), "an item the pattern does not read"
    return out


def test_every_wrapper_has_its_headers_parameters():
    """For every guarded function and every header set that declares it, the wrapper's
    parameter list is that header's: same names, same count, each C type mapped to its Rust
    type (a header that changes one fails here until regenerated)."""
    with open(gen.OUT_RS, encoding="utf-8") as f:
        wrappers = _wrappers_in(f.read())
    with open(gen.SPEC, encoding="utf-8") as f:
        entries, _ = gen.parse_spec(f.read())
    checked = 0
    sets = [gen.Headers.load(d) for d in INCLUDES]
    wrapped_rt = {abi for h in sets if h.major in gen.RUNTIME_MAJORS for abi in h.runtime}
    for h in sets:
        for table, lib in ((h.driver, "Driver"), (h.runtime, "Runtime")):
            for abi, func in table.items():
                if abi not in entries and func.api not in entries:
                    continue
                # A later major's runtime: only the names no wrapped major declares
                # (CUDA 13's cudaGreenCtxCreate, ...) have its wrapper.
                if lib == "Runtime" and h.major not in gen.RUNTIME_MAJORS and abi in wrapped_rt:
                    continue
                func = gen.rustify(func)
                ident = gen.wrapper_ident(lib, abi, h.major)
                assert ident in wrappers, f"{abi} of CUDA {h.major} has no wrapper"
                got_lib, api, params = wrappers[ident]
                assert (got_lib, api) == (lib, func.api)
                want = [(p.name, gen.rust_type(p.ctype, abi)) for p in func.params]
                assert params == want, f"{ident}: {params} != CUDA {h.major}'s {want}"
                checked += 1
    assert checked >= len(wrappers)


@pytest.mark.parametrize("text,message", [
    ("cuDeviceGet: R2 ordinal(ordinal)\n", "before the first `row:`"),
    ("row: a | b\ncuDeviceGet: R2 ordnial(ordinal)\n", "unknown policy 'R2 ordnial(ordinal)'"),
    ("row: a | b\ncuDeviceGet: R4 ordinal(ordinal)\n", "ordinal is R2, written R4"),
    ("row: a | b\ncuDeviceGet: R2 peer(a)\n", "peer takes 2 argument(s), not 1"),
    ("row: a | b\ncuDeviceGet: R2 ordinal(x)\ncuDeviceGet: R2 ordinal(x)\n", "listed twice"),
    ("row: a | b\ncuInit: hook {\n    real(Flags)\n", "no closing line"),
    ("row: a | b\nwhat is this\n", "not `row: ...`"),
])
def test_spec_errors_name_the_line_and_the_fix(text, message):
    with pytest.raises(gen.SpecError, match=re.escape(message)):
        gen.parse_spec(text, "spec")


def test_a_policy_argument_no_variant_has_is_refused():
    entries, _ = gen.parse_spec("row: a | b\ncuDeviceGet: R2 ordinal(dev)\n", "spec")
    h = gen.Headers.load(INCLUDES[0])
    with pytest.raises(gen.SpecError, match=r"no alternative fits cuDeviceGet\(CUdevice_v1\* device, int ordinal\)"):
        gen.choose(entries["cuDeviceGet"], h.driver["cuDeviceGet"])


def test_a_type_without_a_rust_mapping_is_refused():
    with pytest.raises(gen.SpecError, match="add it to SCALARS"):
        gen.rust_type("CUgraphicsResource", "cuX(resource)")
    assert gen.rust_type("const CUmemAccessDesc_v1*", "x") == "*const CUmemAccessDesc"
    assert gen.rust_type("CUgraphNode*", "x") == "*mut c_void"      # opaque pointee
    assert gen.rust_type("void**", "x") == "*mut *mut c_void"


@pytest.mark.parametrize("major", [12, 13])
def test_the_c_compiler_agrees_with_each_majors_wrappers(major):
    """c-tests/tests{,13}/guard_sigs<major>.c (generated) compile only when every runtime
    wrapper's parameter types are what that major's own header declares (the compiler reads
    the header, not this project's parser); built by make, they report how many they check."""
    with open(gen.OUT_SIGS[major], encoding="utf-8") as f:
        n = f.read().count("\nSAME(")
    exe = os.path.join(ROOT, "c-tests", "build", "tests", f"guard_sigs{major}")
    r = subprocess.run([exe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = re.match(rf"guard_sigs{major}: (\d+) wrappers", r.stdout)
    assert m and int(m.group(1)) == n >= 16, r.stdout


def test_a_wrapper_with_the_other_majors_parameters_does_not_compile(tmp_path):
    """Control: the CUDA 13 checks compiled against the 12.9 header fail, at the functions
    whose parameters differ (cudaMemPrefetchAsync first)."""
    src = open(gen.OUT_SIGS[13], encoding="utf-8").read().replace("CUDART_VERSION / 1000 != 13", "0")
    f = tmp_path / "sigs.c"
    f.write_text(src)
    r = subprocess.run(["cc", "-std=gnu11", "-fsyntax-only", "-I", INCLUDES[0], "-idirafter",
                        os.path.join(ROOT, "c-tests", "fake", "runtime", "compat"), str(f)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "cudaMemPrefetchAsync: the header's parameters are not the wrapper's" in r.stderr.replace("\\'", "'")


# ---- the lists beside the table (issue 30): exec's names and shims, the guard's own calls,
# the CLI's driver calls, all from guarded.spec's list lines and the same headers.

LISTS = ("internal: cuDeviceGetCount\ninternal runtime: cudaGetDevice\nexec: execve execv\n"
         "cli: cuInit cuDeviceGetUuid_v2|cuDeviceGetUuid\n")


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def test_no_hand_kept_list_is_left_in_rust():
    """exec's names, its shims' indexes, the guard's own calls' signatures and the CLI's
    driver typedefs live only in generated files: the Rust beside them names none by hand."""
    exec_real = _read("src", "guard", "4_resolve", "exec_real.rs")
    exec_rs = _read("src", "guard", "8_hooks", "exec.rs")
    internal = _read("src", "guard", "4_resolve", "internal.rs")
    cli_sys = _read("src", "cli", "sys.rs")
    assert not re.search(r'c"f?exec\w*"', exec_real), "exec_real.rs lists exec names by hand"
    assert not re.search(r"exec_shim!\(\w+, \d+\)", exec_rs), "exec.rs lists its shims by hand"
    assert not re.search(r"^\s*cu\w+: Driver fn\(", internal, re.M), "internal.rs types a driver call by hand"
    assert not re.search(r"^\s*cuda\w+: fn\(", internal, re.M), "internal.rs types a runtime call by hand"
    assert not re.search(r'^type \w+ = unsafe extern "C" fn', cli_sys, re.M), "sys.rs types a driver call by hand"
    assert not re.search(r"Rule::R\d => \d", _read("src", "guard", "6_audit", "tally.rs")), \
        "tally.rs numbers the rules by hand (the core's Rule::number)"
    # What replaced them: the generated items, used.
    assert "EXEC_NAMES" in exec_real and "exec_shims!(exec_shim)" in exec_rs
    assert 'include!("generated.rs")' in internal and "PFN_cuInit" in cli_sys


def test_the_lists_are_typed_from_the_headers():
    """A function added to a list line comes out with its header's parameters."""
    h = [gen.Headers.load(d) for d in INCLUDES]
    lists = gen.parse_lists(LISTS.replace("cuDeviceGetCount", "cuDeviceGetCount cuDeviceGetAttribute"))
    rs = gen.render_internal_rs(h, lists, "test")
    assert "    cuDeviceGetAttribute: Driver fn(*mut c_int, c_int, CUdevice) -> CuResult;\n" in rs
    assert "    cudaGetDevice: fn(*mut c_int) -> CudaError;\n" in rs
    cli = gen.render_cli_rs(h, lists, "test")
    assert 'pub type PFN_cuInit = unsafe extern "C" fn(c_uint) -> CUresult;\n' in cli
    assert 'pub type PFN_cuDeviceGetUuid_v2 = unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult;\n' in cli
    table = "\n".join(gen.render_exec(lists["exec"]))
    assert 'EXEC_NAMES: [&::std::ffi::CStr; 2] = [c"execve", c"execv"];' in table
    assert "$shim!(execve, 0);\n        $shim!(execv, 1);" in table
    # `const` binds to the innermost pointee (cuGetErrorName's `const char** pStr`).
    assert gen.rust_type("const char**", "x") == "*mut *const c_char"


@pytest.mark.parametrize("text,message", [
    (LISTS.replace("exec: execve execv\n", ""), "no `exec:` line"),
    (LISTS + "exec: execl\n", "`exec:` is given twice"),
    (LISTS.replace("exec: execve execv", "exec: execve execve"), "names one function twice"),
    (LISTS.replace("exec: execve execv", "exec:"), "`exec:` lists nothing"),
    (LISTS.replace("exec: execve execv", "exec: execve|execv"), "is not a C name"),
])
def test_list_errors_name_the_line(text, message):
    with pytest.raises(gen.SpecError, match=re.escape(message)):
        gen.parse_lists(text, "spec")


@pytest.mark.parametrize("old,new,message", [
    ("internal: cuDeviceGetCount", "internal: cuDeviceGetCownt", "cuDeviceGetCownt: no header set declares"),
    ("internal runtime: cudaGetDevice", "internal runtime: cudaMemPrefetchAsync",
     "cudaMemPrefetchAsync: its parameters differ between majors"),
    ("cuDeviceGetUuid_v2|cuDeviceGetUuid", "cuDeviceGetUuid_v2|cuDeviceGet", "a fall-back must have the same type"),
    ("cli: cuInit", "cli: cuInit cuCtxCreate", "no CLI type for the C type 'CUcontext'"),
])
def test_a_list_the_headers_cannot_type_is_refused(old, new, message):
    h = [gen.Headers.load(d) for d in INCLUDES]
    lists = gen.parse_lists(LISTS.replace(old, new))
    with pytest.raises(gen.SpecError, match=re.escape(message)):
        gen.render_internal_rs(h, lists, "test")
        gen.render_cli_rs(h, lists, "test")
