#!/usr/bin/env python3
"""Which CUDA functions touch a device: issue 15's criterion, written as code.

A driver (cuda.h) or runtime (cuda_runtime_api.h) function is *device-touching* when one
of its parameters is

- a device: `CUdevice` by value, `int ordinal` (cuDeviceGet), or a runtime `int` whose
  name says device (`device`, `dev`, `srcDevice`, `dstDevice`, `peerDevice`,
  `device_arr`);
- a location-bearing struct: a struct (by value or pointer) that holds, at any depth, a
  `CUmemLocation`/`cudaMemLocation`, a `CUdevice`, or a runtime `int ...Device` field
  (allocation, pool and access descriptors, graph node parameters, copy attributes);
- a peer pair: two `CUcontext` parameters, or a struct with two `CUcontext` fields
  (`CUDA_MEMCPY3D_PEER`);
- an IPC or shareable handle: legacy IPC handles, shareable-handle types, pool export data,
  dma-buf range handles, external memory and semaphore handle descriptors;
- a multicast or endpoint object (`CUmulticastObjectProp`, `cuMulticast*`,
  `cuLogicalEndpoint*`, `CUlogicalEndpoint...`);
- or the function creates a context: an out-parameter `CUcontext *`, `CUgreenCtx *` or
  `cudaExecutionContext_t *` of a function named `...Create`, `...Retain`,
  `cuCtxFromGreenCtx` or `...GetExecutionCtx`.

The functions and their parameters come from the project's header parser,
`scripts/cudaapi.py` (every driver ABI variant from cudaTypedefs.h, every runtime symbol
from cuda_runtime_api.h: the same reading the guarded table is generated from);
`api_touching(headers)` returns `{api: (lib, [reasons])}` over every ABI variant of each API.
What a struct holds is read here (`structs`: every `struct X { ... }` body of cuda.h or
driver_types.h split into fields, `typedef A B;` aliases followed).

Run: `device_touching.py c-tests/build/cuda13-include` prints one `lib<TAB>api<TAB>reasons`
line per device-touching API of that header set.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

__all__ = ["Param", "Function", "structs", "api_touching"]


@dataclass(frozen=True)
class Param:
    type: str      # normalised: "const CUmemAccessDesc *"
    name: str

    @property
    def base(self) -> str:
        """The type without qualifiers and pointers: `CUmemAccessDesc`."""
        words = [w for w in re.split(r"[\s*]+", self.type)
                 if w and w not in ("const", "struct", "enum", "volatile", "unsigned", "signed")]
        return words[-1] if words else ""

    @property
    def pointer(self) -> int:
        return self.type.count("*") + (1 if self.name.endswith("[]") else 0)


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines = []
    cont = False
    for line in text.splitlines():
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            continue
        lines.append(line)
    return "\n".join(lines)


_MACROS = r"\b(?:__CUDA_DEPRECATED|__host__|__device__|__cudart_builtin__|extern|CUDAAPI|CUDARTAPI|__dv\([^)]*\)|CUDART_CB|CUDA_CB)\b"


def _param(text: str) -> Param | None:
    text = re.sub(r"__dv\([^)]*\)", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    if not text or text == "void":
        return None
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*(\[[^\]]*\])?$", text)
    if not m or not m.group(1).strip():
        return Param(text, "")            # unnamed parameter: the whole text is the type
    ptype = m.group(1).strip()
    name = m.group(2) + ("[]" if m.group(3) else "")
    ptype = re.sub(r"\s*\*\s*", " *", ptype).strip()
    return Param(ptype, name)


def _split_params(body: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def structs(header: str) -> tuple[dict[str, list[Param]], dict[str, str]]:
    """Struct and union fields by every name the struct is known by, and typedef aliases."""
    text = _strip(header)
    fields: dict[str, list[Param]] = {}
    aliases: dict[str, str] = {}
    # Nested bodies: find each `struct|union [tag] {`, match braces, collect the fields of
    # the whole body (nested unions and structs flattened: a field at any depth counts).
    for m in re.finditer(r"\b(?:typedef\s+)?(struct|union)\s+(?:__device_builtin__\s+)?(\w*)\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        flat = re.sub(r"\b(?:struct|union)\s*\w*\s*\{", ";", body).replace("}", ";")
        fl = [p for p in (_param(x) for x in re.split(r";", flat)) if p and p.name]
        tail = re.match(r"\s*([^;]*);", text[i:])
        names = [m.group(2)] if m.group(2) else []
        if tail and text[m.start():m.start() + 7] == "typedef":
            names += [n.strip(" *") for n in tail.group(1).split(",") if n.strip(" *")]
        for n in names:
            if n and re.match(r"^\w+$", n):
                fields.setdefault(n, fl)
    for m in re.finditer(r"\btypedef\s+(?:const\s+)?(?:struct\s+|union\s+|enum\s+)?(\w+)\s*(\*?)\s*(\w+)\s*;", text):
        if not m.group(2):
            aliases.setdefault(m.group(3), m.group(1))
    return fields, aliases


def _resolve(name: str, aliases: dict[str, str]) -> str:
    seen = set()
    while name in aliases and name not in seen:
        seen.add(name)
        name = aliases[name]
    return name


_DEVICE_INT = re.compile(r"^(device|dev|ordinal|srcDevice|dstDevice|peerDevice|device_arr|peer)$")
_HANDLE_TYPES = {
    "CUipcMemHandle", "CUipcEventHandle", "cudaIpcMemHandle_t", "cudaIpcEventHandle_t",
    "CUmemAllocationHandleType", "cudaMemAllocationHandleType", "CUmemPoolPtrExportData",
    "cudaMemPoolPtrExportData", "CUmemRangeHandleType",
    "CUDA_EXTERNAL_MEMORY_HANDLE_DESC", "cudaExternalMemoryHandleDesc",
    "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC", "cudaExternalSemaphoreHandleDesc",
}


class _Types:
    """What each struct holds, at any depth (fixpoints over the header's structs)."""

    def __init__(self, header: str):
        self.fields, self.aliases = structs(header)
        self._memo: dict[tuple[str, str], bool] = {}

    def fields_of(self, t: str) -> list[Param]:
        t = _resolve(t, self.aliases)
        if t in self.fields:
            return self.fields[t]
        # `typedef struct X_st Y;` after the struct: try the tag spelled with _st.
        return self.fields.get(t + "_st", [])

    def holds(self, t: str, what: str, depth: int = 0) -> bool:
        key = (t, what)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = False            # cycles (pointers to self) end here
        r = False
        mine = self.fields_of(t)
        roots = [self.fields_of(n) for n in ("CUmemLocation_st", "cudaMemLocation")]
        if what == "location" and mine and any(mine is x for x in roots):
            r = True
        else:
            for f in self.fields_of(t):
                fb = f.base
                if what == "location":
                    hit = (fb in ("CUdevice", "CUdevice_v1") and f.pointer == 0) or (
                        fb == "int" and f.pointer == 0 and re.search(r"(^d|D)evice$", f.name))
                elif what == "peer":
                    hit = False
                else:
                    hit = False
                if hit or (depth < 8 and fb != t and self.holds(fb, what, depth + 1)):
                    r = True
                    break
            if what == "peer":
                ctxs = [f for f in self.fields_of(t) if f.base == "CUcontext" and f.pointer == 0]
                r = len(ctxs) >= 2
        self._memo[key] = r
        return r


def _reasons(fn: Function, api: str, types: _Types) -> list[str]:
    out = []
    for p in fn.params:
        b = re.sub(r"_v\d+$", "", p.base)       # cudaTypedefs.h writes CUipcMemHandle_v1
        if api == "driver" and b == "CUdevice" and p.pointer == 0:
            out.append(f"device:{p.name}")
        elif b == "int" and _DEVICE_INT.match(p.name) and (p.pointer == 0 or p.name == "device_arr"):
            out.append(f"device:{p.name}")
        elif b in _HANDLE_TYPES or _resolve(b, types.aliases) in _HANDLE_TYPES:
            out.append(f"handle:{p.name}")
        elif "ulticast" in b or "LogicalEndpoint" in b or "logicalEndpoint" in b:
            out.append(f"multicast:{p.name}")
        elif types.holds(p.base, "location"):
            out.append(f"location:{p.name}")
        elif types.holds(p.base, "peer"):
            out.append(f"peer:{p.name}")
    ctxs = [p for p in fn.params if p.base == "CUcontext" and p.pointer == 0]
    if len(ctxs) >= 2 or any(p.name == "peerContext" for p in ctxs):
        out.append("peer:" + ",".join(p.name for p in ctxs))
    if re.match(r"^cu(Multicast|LogicalEndpoint)", fn.name) and not any(r.startswith("multicast") for r in out):
        out.append("multicast:" + fn.name)
    creates = re.search(r"(Create|Retain|FromGreenCtx|GetExecutionCtx)(_v\d+)?(_pt[sd][sz])?$", fn.name)
    if creates and any(p.base in ("CUcontext", "CUgreenCtx", "cudaExecutionContext_t") and p.pointer == 1
                       for p in fn.params):
        out.append("creates-context")
    return out


def api_touching(headers) -> dict[str, tuple[str, list[str]]]:
    """`{api: (lib, [reason, ...])}` for every device-touching API of one header set
    (a `cudaapi.Headers`), the reasons of all its ABI variants together."""
    import os

    def read(name: str) -> str:
        with open(os.path.join(headers.include, name), encoding="utf-8", errors="replace") as f:
            return f.read()

    out: dict[str, tuple[str, list[str]]] = {}
    for lib, table, types in (("driver", headers.driver, _Types(read("cuda.h"))),
                              ("runtime", headers.runtime, _Types(read("cuda_runtime_api.h") + "\n" + read("driver_types.h")))):
        for f in table.values():
            fn = Function(f.api, tuple(Param(p.ctype, p.name) for p in f.params))
            r = _reasons(fn, lib, types)
            if r:
                e = out.setdefault(f.api, (lib, []))
                e[1].extend(x for x in r if x not in e[1])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: device_touching.py INCLUDE_DIR   (e.g. c-tests/build/cuda13-include)", file=sys.stderr)
        return 2
    import cudaapi
    for name, (lib, reasons) in sorted(api_touching(cudaapi.Headers.load(argv[1])).items()):
        print(f"{lib}\t{name}\t{' '.join(reasons)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
