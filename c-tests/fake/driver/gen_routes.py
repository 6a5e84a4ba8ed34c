#!/usr/bin/env python3
"""Generate the fake driver's cuGetProcAddress routing table from NVIDIA's headers.

Several header sets (the pinned 12.9 and 13.x wheels) are merged: --typedefs and --cuda-h
are given once per set, in the same order. A function's variants are the union of its
typedefs in every set (13.x adds cuCtxSynchronize_v13000 = cuCtxSynchronize_v2, ...;
12.9 still has variants 13 no longer lists), every derived symbol must be declared by one
of the cuda.h files, and each cuda.h's remapping macros are checked on their own.

Why: cuGetProcAddress maps (base name, CUDA version, per-thread flag) to one exported ABI
symbol (cuCtxCreate at 3020 -> cuCtxCreate_v2). Writing that table by hand is how earlier
interposers returned the wrong variant (docs/design.md §4), so it is derived here from
cudaTypedefs.h, whose `PFN_<name>_v<version>[_ptds|_ptsz]` typedefs (including the
__CUDA_API_VERSION_INTERNAL section) list every variant and the version it appeared in.

Naming rule (verified below against cuda.h, the build fails on any mismatch):
  * the variants of a base name, ordered by version, are exported as <name>, <name>_v2,
    <name>_v3, ...  (cuCtxCreate 2000/3020/11040/12050 -> bare/_v2/_v3/_v4);
  * a per-thread typedef at version V is the ABI symbol of the newest legacy variant at
    or before V plus its suffix (cuMemcpyHtoD_v7000_ptds -> cuMemcpyHtoD_v2_ptds).
Verification: every derived symbol must be a function name cuda.h declares (compiled
with __CUDA_API_VERSION_INTERNAL, where the legacy names are declared verbatim) or the
target of one of cuda.h's `#define cuX cuX_vN` / __CUDA_API_PTDS(...) remapping macros,
and every macro must name a derived variant of its base name. A cu* function the fake
defines under any other name is refused (it could never be routed).

Output (one C file, stdlib only, no cuda.h include so stub prototypes cannot clash):
  * fakecuda_routes[]: {name, version, per_thread, abi, fn} sorted by name; fn points at the
    fake's own function when the symbol list from `nm` (--implemented) has it, else at a
    generated exported stub returning CUDA_ERROR_NOT_SUPPORTED (801);
  * fakecuda_errors[]: CUresult names and descriptions from cuda.h's cudaError_enum;
  * fakecuda_device_attrs[]: the valid CUdevice_attribute values.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

# `typedef CUresult (CUDAAPI *PFN_..` and, for some entry points (cuStreamGetDevResource,
# the green-context ones), `typedef CUresult(CUDAAPI *PFN_..`: the space is optional.
PFN_RE = re.compile(r"\btypedef\s+CUresult\s*\(CUDAAPI\s+\*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)\s*\(")
DECL_RE = re.compile(r"\bCUDAAPI\s+(cu\w+)\s*\(")
DEFINE_RE = re.compile(r"^\s*#define\s+(cu\w+)\s+(?:__CUDA_API_(PTDS|PTSZ)\((cu\w+)\)|(cu\w+))\s*$")

# Where cuda.h's remapping macro names a *different* base function; the typedef header
# says the same (`#define PFN_cuGraphInstantiate PFN_cuGraphInstantiateWithFlags_v11040`).
# cuGetProcAddress("cuGraphInstantiate") still routes by cuGraphInstantiate's own
# typedefs; this is the only such macro in 12.9 and it is listed, not guessed.
CROSS_NAME_MACROS = {"cuGraphInstantiate": "cuGraphInstantiateWithFlags"}


def parse_typedefs(text: str):
    variants = defaultdict(set)          # name -> {versions}
    per_thread = defaultdict(dict)       # name -> {version: suffix}
    for m in PFN_RE.finditer(text):
        name, ver, suffix = m.group(1), int(m.group(2)), m.group(3)
        if suffix:
            per_thread[name][ver] = suffix
        else:
            variants[name].add(ver)
    return variants, per_thread


def derive(variants, per_thread):
    """[(name, version, per_thread(0/1), abi)] following the naming rule above."""
    routes = []
    for name in sorted(set(variants) | set(per_thread)):
        legacy = sorted(variants.get(name, ()))
        if not legacy:
            raise SystemExit(f"gen_routes: {name} has only per-thread typedefs; "
                             "the naming rule cannot place it")
        abi_of = {}
        for k, ver in enumerate(legacy):
            abi_of[ver] = name if k == 0 else f"{name}_v{k + 1}"
            routes.append((name, ver, 0, abi_of[ver]))
        for ver, suffix in sorted(per_thread.get(name, {}).items()):
            base = [v for v in legacy if v <= ver]
            if not base:
                raise SystemExit(f"gen_routes: {name}_v{ver}{suffix} predates every legacy "
                                 "variant of it")
            routes.append((name, ver, 1, abi_of[base[-1]] + suffix))
    return routes


def verify(routes, cuda_hs: list[str]):
    """Errors of the derived routes against every cuda.h (see the module docstring)."""
    declared = set()
    for cuda_h in cuda_hs:
        declared |= set(DECL_RE.findall(cuda_h))
    errors = []
    checks = [verify_one(routes, cuda_h, declared) for cuda_h in cuda_hs]
    for abi_missing, errs in checks:
        errors += errs
    # A symbol is missing only when no header declares it (or a macro targets it).
    errors += sorted(set.intersection(*(m for m, _ in checks)))
    return errors


def verify_one(routes, cuda_h: str, declared_elsewhere: set):
    declared = set(DECL_RE.findall(cuda_h)) | declared_elsewhere
    macro_target = {}
    for line in cuda_h.splitlines():
        m = DEFINE_RE.match(line)
        if not m:
            continue
        src = m.group(1)
        if m.group(3):
            tgt = m.group(3) + ("_ptds" if m.group(2) == "PTDS" else "_ptsz")
            macro_target.setdefault(src + "#pt", tgt)
            declared.add(tgt)
            declared.add(m.group(3))
        else:
            tgt = m.group(4)
            # `#define cuCtxCreate_v4 cuCtxCreate_v4` (identity) still asserts that
            # variant exists: checked like any other target below.
            macro_target.setdefault(src, tgt)
            declared.add(tgt)
    errors = []
    missing = set()
    for name, ver, pt, abi in routes:
        if abi not in declared:
            missing.add(f"{name} v{ver}{' per-thread' if pt else ''} -> {abi}: "
                        "not a function any cuda.h declares")
    # cuda.h's macros pick the variant new code compiles against, which is not always
    # the newest (cuCtxCreate stays _v2 for source compatibility): the target must be one
    # of the derived variants of that base name, and a macro naming a versioned variant
    # (`#define cuCtxCreate_v3 cuCtxCreate_v3`) must name a derived one.
    legacy_abis = defaultdict(set)
    pt_abis = defaultdict(set)
    all_abis = set()
    for name, ver, pt, abi in routes:
        (pt_abis if pt else legacy_abis)[name].add(abi)
        all_abis.add(abi)
    # `#define cuGetProcAddress_v2 cuGetProcAddress_v2_ptsz` names a static inline
    # helper in cuda.h, not an exported symbol.
    inline = set(re.findall(r"static\s+inline\s+CUresult\s+(cu\w+)\s*\(", cuda_h))
    checked = 0
    for src, tgt in macro_target.items():
        if tgt in inline:
            continue
        pt = src.endswith("#pt")
        base = src[:-3] if pt else src
        if base in CROSS_NAME_MACROS:
            if CROSS_NAME_MACROS[base] != tgt:
                errors.append(f"{base}: listed cross-name macro changed to {tgt}")
            continue
        if base in legacy_abis:
            pool = pt_abis[base] if pt else legacy_abis[base]
            if tgt not in pool:
                errors.append(f"{base}: cuda.h maps it to {tgt}, not one of the derived "
                              f"variants {sorted(pool)}")
            checked += 1
        elif tgt != base or pt or re.sub(r"_v\d+$", "", base) in legacy_abis:
            if tgt not in all_abis:
                errors.append(f"{src}: cuda.h maps it to {tgt}, which no typedef derives")
            checked += 1
    if checked < 50:
        errors.append(f"only {checked} cuda.h remapping macros checked: header layout changed?")
    return missing, errors


def parse_errors(cuda_h: str):
    body = cuda_h[cuda_h.index("typedef enum cudaError_enum"):]
    body = body[:body.index("} CUresult;")]
    out = []
    for m in re.finditer(r"/\*\*(.*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)", body, re.S):
        doc = " ".join(w.strip(" *") for w in m.group(1).split("\n"))
        doc = re.sub(r"\s+", " ", doc).strip()
        doc = re.sub(r"::|\\p |\\ref ", "", doc)
        first = re.split(r"(?<=[a-z0-9)])\. ", doc)[0].rstrip(".")
        out.append((int(m.group(3)), m.group(2), first))
    return out


def parse_device_attrs(cuda_h: str):
    body = cuda_h[cuda_h.index("typedef enum CUdevice_attribute_enum"):]
    body = body[:body.index("} CUdevice_attribute;")]
    return sorted({int(v) for v in re.findall(r"CU_DEVICE_ATTRIBUTE_\w+\s*=\s*(\d+)", body)})


def c_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--typedefs", required=True, action="append",
                    help="cudaTypedefs.h of one header set (repeat per set)")
    ap.add_argument("--cuda-h", required=True, action="append",
                    help="cuda.h of the same set (same order as --typedefs)")
    ap.add_argument("--implemented", required=True,
                    help="file with the symbols the fake defines (nm output, one per line)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    if len(a.typedefs) != len(a.cuda_h):
        ap.error("give --typedefs and --cuda-h once per header set, in the same order")
    cuda_hs = [open(p).read() for p in a.cuda_h]
    variants, per_thread = defaultdict(set), defaultdict(dict)
    for p in a.typedefs:
        v, pt = parse_typedefs(open(p).read())
        for name, vers in v.items():
            variants[name] |= vers
        for name, d in pt.items():
            per_thread[name].update(d)
    routes = derive(variants, per_thread)
    errors = verify(routes, cuda_hs)
    if errors:
        print("gen_routes: the ABI naming rule disagrees with cuda.h:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1

    implemented = set()
    for line in open(a.implemented):
        parts = line.split()
        if parts:
            implemented.add(parts[-1])
    abis = sorted({r[3] for r in routes})
    # A cu* function the fake defines under a name no typedef derives would never be
    # routed (a typo such as cuMemcpyHtoD_ptds for cuMemcpyHtoD_v2_ptds): refuse it.
    stray = sorted(s for s in implemented if s.startswith("cu") and s not in set(abis))
    if stray:
        print("gen_routes: the fake defines functions no cudaTypedefs.h variant names: "
              + ", ".join(stray) + "; rename them to their ABI names", file=sys.stderr)
        return 1
    stubs = [s for s in abis if s not in implemented]
    routes.sort(key=lambda r: (r[0], r[2], r[1]))

    o = []
    o.append("/* GENERATED by c-tests/fake/driver/gen_routes.py from cudaTypedefs.h and cuda.h.")
    o.append(" * Do not edit. The cuGetProcAddress routing table, stubs for the variants the fake")
    o.append(" * does not implement, CUresult names and the valid CUdevice_attribute values. */")
    o.append('#include "fakecuda_routes.h"')
    o.append("")
    o.append("/* The fake's own implementations. Linked with -Bsymbolic, so these addresses are the")
    o.append(" * library's own functions even when a preload exports the same names. */")
    for s in abis:
        if s in implemented:
            o.append(f"extern void {s}(void);")
    o.append("")
    o.append("/* Variants the fake does not implement: exported like the real driver's, they fail")
    o.append(" * with CUDA_ERROR_NOT_SUPPORTED (801) whatever their arguments. */")
    for s in stubs:
        o.append(f"__attribute__((visibility(\"default\"))) int {s}(void) {{ return 801; }}")
    o.append("")
    o.append("const struct fakecuda_route fakecuda_routes[] = {")
    for name, ver, pt, abi in routes:
        impl = 1 if abi in implemented else 0
        o.append(f"    {{{c_str(name)}, {ver}, {pt}, {impl}, {c_str(abi)}, (void (*)(void)){abi}}},")
    o.append("};")
    o.append(f"const unsigned fakecuda_routes_len = {len(routes)};")
    o.append("")
    o.append("const struct fakecuda_error fakecuda_errors[] = {")
    # Error names and device attributes: the union of the sets; where a code's text
    # differs, the last (newest) header's.
    errs = {}
    for cuda_h in cuda_hs:
        for code, name, desc in parse_errors(cuda_h):
            errs[code] = (name, desc)
    for code in sorted(errs):
        name, desc = errs[code]
        o.append(f"    {{{code}, {c_str(name)}, {c_str(desc)}}},")
    o.append("};")
    o.append(f"const unsigned fakecuda_errors_len = {len(errs)};")
    o.append("")
    attrs = sorted(set().union(*(parse_device_attrs(h) for h in cuda_hs)))
    o.append("const int fakecuda_device_attrs[] = {" + ", ".join(map(str, attrs)) + "};")
    o.append(f"const unsigned fakecuda_device_attrs_len = {len(attrs)};")
    with open(a.output, "w") as f:
        f.write("\n".join(o) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
