"""The fake runtime runs the framework our users run: PyTorch (the pinned 2.15.0 of
.venv-torch) on the fake node (scripts/fake-node).

The list of runtime names torch needs is derived, never typed: every undefined
`NAME@libcudart.so.13` reference of the installed torch's libraries must be a definition
`NAME@@libcudart.so.13` of the fake libcudart.so.13."""
from __future__ import annotations

import subprocess

from conftest import FAKE, TORCH_SITE, fake_node


def _symbols(lib, *flags) -> set[str]:
    out = subprocess.run(["nm", "-D", *flags, str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()}


def torch_cudart_imports() -> dict[str, set[str]]:
    """{name: the torch libraries importing it} for every NAME@libcudart.so.13 reference."""
    libs = sorted((TORCH_SITE / "torch" / "lib").glob("*.so*"))
    assert libs, f"no libraries under {TORCH_SITE / 'torch' / 'lib'}: run scripts/setup"
    need: dict[str, set[str]] = {}
    for lib in libs:
        for sym in _symbols(lib, "--undefined-only"):
            name, _, version = sym.partition("@")
            if version == "libcudart.so.13":
                need.setdefault(name, set()).add(lib.name)
    return need


def test_fake_runtime_defines_every_name_torch_imports():
    need = torch_cudart_imports()
    # libtorch_cuda alone imports over a hundred; a parse that finds a handful is broken.
    assert len(need) > 100, sorted(need)
    have = {s.split("@@")[0] for s in _symbols(FAKE / "libcudart.so.13", "--defined-only")
            if s.endswith("@@libcudart.so.13")}
    missing = {n: sorted(libs) for n, libs in need.items() if n not in have}
    assert not missing, f"the fake libcudart.so.13 lacks names torch imports: {missing}"


def test_torch_on_the_fake_node_loads_the_fake_runtime_and_moves_bytes():
    code = r"""
import torch
maps = open("/proc/self/maps").read()
print("cudart", sorted({l.split()[-1] for l in maps.splitlines() if "libcudart" in l}))
print("count", torch.cuda.device_count())
torch.cuda.set_device(0)
x = torch.arange(1024, dtype=torch.float32).cuda()
s = torch.cuda.Stream(priority=-1)
with torch.cuda.stream(s):
    y = torch.empty_like(x)
    y.copy_(x, non_blocking=True)
torch.cuda.synchronize()
z = torch.full((64,), 0, dtype=torch.uint8, device="cuda")
p = torch.arange(64, dtype=torch.uint8).pin_memory()
z.copy_(p, non_blocking=True)
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record(); e1.record(); e1.synchronize()
print("same", bool((y.cpu() == torch.arange(1024, dtype=torch.float32)).all()))
print("pinned", p.is_pinned(), "copied", z.cpu().tolist() == list(range(64)))
print("priority", s.priority, "elapsed", e0.elapsed_time(e1) >= 0)
"""
    p = fake_node(["python", "-c", code], env=None)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert lines["cudart"] == f"[{str(FAKE / 'libcudart.so.13')!r}]", p.stdout
    assert lines["count"] == "8"
    assert lines["same"] == "True"
    assert lines["pinned"] == "True copied True"
    assert lines["priority"] == "-1 elapsed True"
