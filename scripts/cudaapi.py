"""NVIDIA's CUDA headers as data: every driver and runtime function's exported ABI symbols
and C parameter lists, per header set (one CUDA major). Stdlib only; importable
(`scripts/gen_guarded.py` builds the guarded table on it, `scripts/device_touching.py`
classifies functions with it).

Driver (`cudaTypedefs.h`): each `PFN_<name>_v<version>[_ptds|_ptsz]` typedef is one ABI
variant with its parameters. The exported symbol follows the naming rule the fake driver's
route generator (`c-tests/fake/driver/gen_routes.py`) verifies against `cuda.h`: the variants
of a name ordered by version are `<name>`, `<name>_v2`, `<name>_v3`, ...; a per-thread
typedef at version V is the newest legacy variant at or before V plus its suffix.

Runtime (`cuda_runtime_api.h`): each public `cudaError_t CUDARTAPI name(params);`
declaration, under the symbols the header binds the name to: `#define name target` (12.9's
`cudaGetDeviceProperties` -> `cudaGetDeviceProperties_v2`) and `__CUDART_API_PTSZ(name)` /
`__CUDART_API_PTDS(name)` (the runtime exports `name` and `name_ptsz`, same parameters).
The runtime keeps names across majors and changes their meaning, so a runtime symbol is
only meaningful together with its header set's major (`Headers.major`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Param:
    ctype: str   # normalised C type: single spaces, `*` attached (`const void*`)
    name: str


@dataclass(frozen=True)
class Func:
    lib: str                     # "driver" or "runtime"
    api: str                     # the name programs write: cuCtxCreate, cudaSetDevice
    abi: str                     # the exported symbol: cuCtxCreate_v4, cudaSetDevice_ptsz
    params: tuple[Param, ...]
    version: Optional[int] = None      # driver: the PFN typedef's version
    per_thread: Optional[str] = None   # "_ptds" / "_ptsz" for per-thread variants

    def ctypes(self) -> tuple[str, ...]:
        return tuple(p.ctype for p in self.params)


class HeaderError(Exception):
    """The headers do not have the layout this parser knows (say which and where)."""


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_params(params: str, where: str) -> tuple[Param, ...]:
    """The (type, name) list of a C parameter list; C++ default values dropped."""
    params = re.sub(r"__dv\([^)]*\)", "", params)
    out = []
    for raw in params.split(","):
        p = " ".join(raw.split("=")[0].split())
        if p in ("", "void"):
            continue
        p = re.sub(r"\s*\[[^\]]*\]\s*$", "*", p)            # `T name[]` -> `T* name`
        if p.endswith("*"):                                  # `T name[]` became `T name*`
            m = re.match(r"^(.*?)\s*(\w+)\*$", p)
            if not m:
                raise HeaderError(f"{where}: cannot split parameter {raw.strip()!r}")
            p = f"{m.group(1)}* {m.group(2)}"
        m = re.match(r"^(.*?[\s\*])(\w+)$", p)
        if not m:
            raise HeaderError(f"{where}: cannot split parameter {raw.strip()!r}")
        ctype = re.sub(r"\s*\*", "*", m.group(1).strip())
        ctype = re.sub(r"\*(?=\w)", "* ", ctype)             # `void*const` stays readable
        out.append(Param(" ".join(ctype.split()), m.group(2)))
    return tuple(out)


PFN_RE = re.compile(r"\btypedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)"
                    r"\s*\(([^;]*?)\)\s*;", re.S)
RT_DECL_RE = re.compile(r"\bcudaError_t\s+CUDARTAPI\s+(cuda\w+)\s*\(([^;{]*?)\)\s*;", re.S)
RT_MACRO_RE = re.compile(r"^\s*#\s*define\s+(cuda\w+)\s+(?:__CUDART_API_(PTSZ|PTDS)\((cuda\w+)\)|(cuda\w+))\s*$",
                         re.M)
RT_INTERNAL = "#if defined(__CUDA_API_VERSION_INTERNAL)"


def driver_functions(typedefs_text: str, where: str = "cudaTypedefs.h") -> dict[str, Func]:
    """Every driver ABI variant: {abi: Func}."""
    text = strip_comments(typedefs_text)
    legacy: dict[str, dict[int, tuple[Param, ...]]] = {}
    per_thread: dict[str, dict[int, tuple[str, tuple[Param, ...]]]] = {}
    for m in PFN_RE.finditer(text):
        name, ver, suffix, params = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        ps = parse_params(params, f"{where}: PFN_{name}_v{ver}{suffix or ''}")
        if suffix:
            per_thread.setdefault(name, {})[ver] = (suffix, ps)
        else:
            legacy.setdefault(name, {})[ver] = ps
    if len(legacy) < 100:
        raise HeaderError(f"{where}: only {len(legacy)} PFN typedefs found; header layout changed?")
    out: dict[str, Func] = {}
    for name in sorted(set(legacy) | set(per_thread)):
        vers = sorted(legacy.get(name, {}))
        if not vers:
            raise HeaderError(f"{where}: {name} has only per-thread typedefs; the naming rule cannot place it")
        abi_of = {}
        for k, ver in enumerate(vers):
            abi_of[ver] = name if k == 0 else f"{name}_v{k + 1}"
            out[abi_of[ver]] = Func("driver", name, abi_of[ver], legacy[name][ver], ver, None)
        for ver, (suffix, ps) in sorted(per_thread.get(name, {}).items()):
            base = [v for v in vers if v <= ver]
            if not base:
                raise HeaderError(f"{where}: {name}_v{ver}{suffix} predates every legacy variant of it")
            abi = abi_of[base[-1]] + suffix
            out[abi] = Func("driver", name, abi, ps, ver, suffix)
    return out


def runtime_functions(api_text: str, where: str = "cuda_runtime_api.h") -> dict[str, Func]:
    """Every public runtime function under each symbol the header binds it to: {abi: Func}."""
    text = strip_comments(api_text.split(RT_INTERNAL, 1)[0])
    decls: dict[str, tuple[Param, ...]] = {}
    for name, params in RT_DECL_RE.findall(text):
        ps = parse_params(params, f"{where}: {name}")
        if name in decls and decls[name] != ps:
            raise HeaderError(f"{where}: {name} is declared twice with different parameters")
        decls[name] = ps
    if len(decls) < 100:
        raise HeaderError(f"{where}: only {len(decls)} runtime declarations found; header layout changed?")
    symbols: dict[str, tuple[str, Optional[str]]] = {}
    for name, kind, pt_target, target in RT_MACRO_RE.findall(text):
        if pt_target:
            symbols[name] = (pt_target, "_" + kind.lower())
        else:
            symbols[name] = (target, None)
    out: dict[str, Func] = {}
    for name, ps in decls.items():
        target, suffix = symbols.get(name, (name, None))
        for abi, pt in [(target, None)] + ([(target + suffix, suffix)] if suffix else []):
            if abi in out and out[abi].params != ps:
                raise HeaderError(f"{where}: {abi} is bound to two declarations with different parameters")
            out[abi] = Func("runtime", name, abi, ps, None, pt)
    return out


@dataclass
class Headers:
    """One header set (one CUDA major)."""
    include: str
    major: int
    version: int                      # CUDA_VERSION, e.g. 12090
    driver: dict[str, Func]
    runtime: dict[str, Func]

    @classmethod
    def load(cls, include: str) -> "Headers":
        def read(name: str) -> str:
            path = os.path.join(include, name)
            try:
                with open(path, encoding="utf-8") as f:
                    return f.read()
            except OSError as e:
                raise HeaderError(f"{path}: {e.strerror}; NVIDIA's headers come from scripts/setup") from e
        cuda_h = read("cuda.h")
        m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", cuda_h, re.M)
        if not m:
            raise HeaderError(f"{include}/cuda.h: no CUDA_VERSION")
        version = int(m.group(1))
        return cls(include, version // 1000, version,
                   driver_functions(read("cudaTypedefs.h"), f"{include}/cudaTypedefs.h"),
                   runtime_functions(read("cuda_runtime_api.h"), f"{include}/cuda_runtime_api.h"))

    def variants(self, api: str) -> list[Func]:
        """Every ABI variant of a driver or runtime API name, ordered by symbol."""
        table = self.driver if api.startswith("cu") and not api.startswith("cuda") else self.runtime
        return sorted((f for f in table.values() if f.api == api), key=lambda f: f.abi)


def default_includes(root: str) -> list[str]:
    """The header sets scripts/setup provides: 12.9, then 13.x."""
    return [os.path.join(root, "c-tests", "build", "cuda-include"),
            os.path.join(root, "c-tests", "build", "cuda13-include")]
