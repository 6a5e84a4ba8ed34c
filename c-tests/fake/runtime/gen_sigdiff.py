#!/usr/bin/env python3
"""List the runtime functions whose C signature or exported symbol differs between two
cuda_runtime_api.h headers (the pinned 12.9 and 13.x wheels).

Why: the CUDA runtime keeps a function's name and changes its signature between majors
(cudaMemPrefetchAsync: `int dstDevice` in 12, `struct cudaMemLocation, unsigned flags` in
13) and tells the two apart only by the version node. The fake runtimes, their argument
log and the test programs must cover exactly those functions; the list comes from the
headers, never typed by hand, so a new header that changes one shows up here.

For each header: every `cudaError_t CUDARTAPI name(params);` declaration, and every
remapping macro `#define name target` / `#define name __CUDART_API_PTSZ(target)` (the
symbol a program that calls `name` references), before the __CUDA_API_VERSION_INTERNAL
section (which re-declares legacy symbols for NVIDIA's own build). Two kinds of difference, by API name:
  * sig:    declared in both headers with different parameter types (names ignored);
  * symbol: both declare it, but 12 maps it to a suffixed symbol (`_v2`, ...) that 13
            does not (13 exports the plain name with the meaning of 12's suffixed one).

Output (--out-h): an X-macro list FAKECUDART_SIGDIFF(name, kind) for C; (--out-txt):
one `name kind` line each, for the tests; (--out-c with --stubs-for HEADER): the fake
runtime's weak stubs of those functions with HEADER's signatures, under every symbol HEADER
binds them to (plain and `_ptsz`), each recording its arguments (RT_LOG) and returning
cudaErrorNotSupported. With no output option it prints the text form.
"""
from __future__ import annotations

import argparse
import re
import sys

DECL_RE = re.compile(r"\bcudaError_t\s+CUDARTAPI\s+(cuda\w+)\s*\(([^;{]*?)\)\s*;", re.S)
MACRO_RE = re.compile(r"^\s*#\s*define\s+(cuda\w+)\s+(?:__CUDART_API_(PTSZ|PTDS)\((cuda\w+)\)|(cuda\w+))\s*$",
                      re.M)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def params_of(params: str) -> list[tuple[str, str]]:
    """[(type, name)] of a parameter list, without defaults or spacing differences."""
    params = re.sub(r"__dv\([^)]*\)", "", params)
    out = []
    for p in (x.split("=")[0].strip() for x in params.split(",")):   # C++ default values
        p = " ".join(p.split())
        if p in ("", "void"):
            continue
        p = re.sub(r"\s*\[[^\]]*\]\s*$", "*", p)          # `T name[]` -> `T*`
        m = re.match(r"^(.*?[\s\*])(\w+)$", p)            # drop the trailing name
        if not m:
            raise SystemExit(f"gen_sigdiff: cannot split parameter {p!r}")
        t = m.group(1).replace(" *", "*").strip()
        out.append((re.sub(r"\s+", " ", t), m.group(2)))
    return out


def param_types(params: str) -> tuple[str, ...]:
    return tuple(t for t, _ in params_of(params))


INTERNAL = "#if defined(__CUDA_API_VERSION_INTERNAL)"


def parse(path: str):
    text = open(path, encoding="utf-8").read()
    # The section under __CUDA_API_VERSION_INTERNAL (NVIDIA's own build) re-declares the
    # legacy symbols with their old types; the public API is what comes before it.
    if INTERNAL not in text:
        raise SystemExit(f"gen_sigdiff: {path}: no `{INTERNAL}` section; unknown header layout")
    text = strip_comments(text.split(INTERNAL, 1)[0])
    decls: dict[str, tuple[str, ...]] = {}
    raw: dict[str, list[tuple[str, str]]] = {}
    for name, params in DECL_RE.findall(text):
        t = param_types(params)
        if name in decls and decls[name] != t:
            raise SystemExit(f"gen_sigdiff: {path}: {name} declared twice with different types")
        decls[name] = t
        raw.setdefault(name, params_of(params))
    suffixed = {}
    symbols: dict[str, list[str]] = {}
    for name, kind, ptsz_target, target in MACRO_RE.findall(text):
        target = target or ptsz_target
        if target != name:
            suffixed[name] = target
        # Without CUDA_API_PER_THREAD_DEFAULT_STREAM __CUDART_API_PTSZ(x) is x; with it,
        # x_ptsz: the library exports both.
        symbols[name] = [target] + ([f"{target}_{kind.lower()}"] if kind else [])
    if not decls:
        raise SystemExit(f"gen_sigdiff: no runtime declarations found in {path}")
    return decls, suffixed, raw, symbols


def diff(old_h: str, new_h: str):
    old, old_sfx, _, _ = parse(old_h)
    new, new_sfx, _, _ = parse(new_h)
    rows = []
    for name in sorted(set(old) & set(new)):
        if old[name] != new[name]:
            rows.append((name, "sig"))
        elif name in old_sfx and old_sfx[name] != new_sfx.get(name, name):
            rows.append((name, "symbol"))
    return rows


SCALAR_FMT = {
    "int": ("%d", "{}"),
    "unsigned int": ("%u", "{}"),
    "size_t": ("%zu", "{}"),
    "unsigned long long": ("%llu", "{}"),
}
# By-value structs: every field is logged. A new one must be added here (the generator
# refuses a by-value struct it cannot print in full).
STRUCT_FMT = {
    "struct cudaMemLocation": ("{type=%d,id=%d}", "(int){0}.type, {0}.id"),
}


def log_arg(ctype: str, name: str) -> tuple[str, str]:
    """(printf format, C argument expression) of one parameter for the argument log."""
    if ctype in SCALAR_FMT:
        f, e = SCALAR_FMT[ctype]
        return f"{name}={f}", e.format(name)
    if ctype in STRUCT_FMT:
        f, e = STRUCT_FMT[ctype]
        return f"{name}={f}", e.format(name)
    if ctype.endswith("*"):
        return f"{name}=%p", f"(const void *){name}"
    if ctype.startswith("enum "):
        return f"{name}=%d", f"(int){name}"
    if re.fullmatch(r"cuda\w+_t", ctype):
        # An opaque handle typedef (cudaStream_t, cudaGraph_t, ...): RT_LOG_HANDLE fails
        # the build if it is not a pointer type.
        return f"{name}=%p", f"RT_LOG_HANDLE({name})"
    raise SystemExit(f"gen_sigdiff: no log format for parameter type {ctype!r} ({name})")


def stubs_c(header: str, names: list[str]) -> str:
    """Weak exported stubs, with the header's own parameter lists, for every symbol the
    header binds `names` to: each records its arguments and returns
    cudaErrorNotSupported. A hand-written definition of the same symbol replaces it."""
    _, _, raw, symbols = parse(header)
    out = ["/* Generated by c-tests/fake/runtime/gen_sigdiff.py from " + header.rsplit("/", 2)[-2]
           + "/cuda_runtime_api.h. Do not edit. */\n",
           '#include "cudart_internal.h"\n\n']
    for name in names:
        params = raw[name]
        proto = ", ".join(f"{t} {n}" for t, n in params) or "void"
        fmts, args = zip(*(log_arg(t, n) for t, n in params)) if params else ((), ())
        for sym in symbols.get(name, [name]):
            out.append(f"RT_STUB cudaError_t {sym}({proto});\n")
            out.append(f"RT_STUB cudaError_t {sym}({proto})\n{{\n")
            fmt = " ".join(fmts)
            argl = "".join(f", {a}" for a in args)
            out.append(f'    RT_LOG("{sym}", "{fmt}"{argl});\n')
            out.append("    return rt_ret(cudaErrorNotSupported);\n}\n\n")
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="cuda_runtime_api.h of the older major (12.9)")
    ap.add_argument("new", help="cuda_runtime_api.h of the newer major (13.x)")
    ap.add_argument("--out-h")
    ap.add_argument("--out-txt")
    ap.add_argument("--stubs-for", metavar="HEADER",
                    help="write C stubs (--out-c) for the differing functions as HEADER declares them")
    ap.add_argument("--out-c")
    a = ap.parse_args()
    rows = diff(a.old, a.new)
    if not rows:
        raise SystemExit("gen_sigdiff: no differences found: wrong headers?")
    if a.out_c:
        if not a.stubs_for:
            raise SystemExit("gen_sigdiff: --out-c needs --stubs-for HEADER")
        open(a.out_c, "w").write(stubs_c(a.stubs_for, [n for n, _ in rows]))
    txt = "".join(f"{n} {k}\n" for n, k in rows)
    if a.out_txt:
        open(a.out_txt, "w").write(txt)
    if a.out_h:
        with open(a.out_h, "w") as f:
            f.write("/* Generated by c-tests/fake/runtime/gen_sigdiff.py from the 12.9 and 13.x\n"
                    " * cuda_runtime_api.h: runtime functions whose signature (sig) or exported\n"
                    " * symbol (symbol) differs between the two majors. Do not edit. */\n")
            for n, k in rows:
                f.write(f"FAKECUDART_SIGDIFF({n}, {k})\n")
    if not (a.out_h or a.out_txt or a.out_c):
        sys.stdout.write(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
