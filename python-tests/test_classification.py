"""Every device-touching CUDA function of the 12.9 and 13.x headers is classified (issue 15).

scripts/device_touching.py finds them (the criterion as code); src/guard/2_table/classification.tsv
says for each whether the guard enforces a rule on it, observes it (a query) or passes it
with a reason; scripts/classification.py checks both against the guarded table and renders
docs/classification.md. These tests fail when a header gains an unclassified function,
when the classification claims a guard the table does not have, or when the document is
stale; the self-checks show that they can fail.
"""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from conftest import ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    spec.loader.exec_module(mod)
    return mod


C = _load("classification")
D = _load("device_touching")


@pytest.fixture(scope="module")
def found():
    return C.touching()


@pytest.fixture(scope="module")
def cls():
    return C.load_classification()


def test_every_device_touching_function_of_both_majors_is_classified(found, cls):
    assert C.problems(found, cls, C.guarded_names()) == []
    majors = {m for e in found.values() for m in e["majors"]}
    assert majors == {"12.9", "13.x"}, majors
    assert {e["api"] for e in found.values()} == {"driver", "runtime"}


@pytest.mark.parametrize("name", ["cudaMemAdvise", "cuMemcpyBatchAsync"])
def test_self_check_a_guarded_function_classified_passed_fails(found, cls, name):
    """A function the guard wraps cannot be classified `passed` (a stale reason such as
    NOT YET GUARDED is reported)."""
    assert cls[name][0] == "enforced"
    stale = {**cls, name: ("passed", "NOT YET GUARDED")}
    bad = C.problems(found, stale, C.guarded_names())
    assert bad == [f"{name}: classified passed but in the guarded table (say which rule it "
                   "enforces, or observed)"], bad


@pytest.mark.parametrize("name", ["cuMemPoolSetAccess", "cudaDeviceGetDefaultMemPool",
                                  "cuDeviceGetP2PAttribute", "cuMulticastBindMem",
                                  "cuMemPrefetchBatchAsync", "cudaGreenCtxCreate"])
def test_self_check_one_entry_removed_fails(found, cls, name):
    """Remove one entry (enforced, observed, passed; 12.9 and 13-only): reported."""
    assert name in cls and name in found
    less = {k: v for k, v in cls.items() if k != name}
    bad = C.problems(found, less, C.guarded_names())
    assert len(bad) == 1 and bad[0].startswith(f"{name}: device-touching"), bad


def test_self_check_a_claimed_guard_must_exist(found, cls):
    guarded = C.guarded_names() - {"cuMemPoolSetAccess"}
    bad = C.problems(found, cls, guarded)
    assert bad == ["cuMemPoolSetAccess: classified enforced but not in the guarded table"], bad


def test_a_new_function_in_a_new_header_breaks_the_build(cls):
    """What a CUDA release adding a device-touching function does: it is found, unclassified."""
    inc = ROOT / "c-tests/build/cuda13-include"
    h = C.cudaapi.Headers.load(str(inc))
    typedefs = (inc / "cudaTypedefs.h").read_text(errors="replace")
    typedefs += "\ntypedef CUresult (CUDAAPI *PFN_cuDeviceSetFutureKnob_v14000)(CUdevice dev, int knob);\n"
    h = C.cudaapi.Headers(h.include, 14, 14000, C.cudaapi.driver_functions(typedefs), h.runtime)
    found = {n: {"api": lib, "majors": ["14.0"], "reasons": r}
             for n, (lib, r) in D.api_touching(h).items()}
    bad = [p for p in C.problems(found, cls, C.guarded_names()) if p.startswith("cuDeviceSetFutureKnob")]
    assert bad == ["cuDeviceSetFutureKnob: device-touching (device:dev; CUDA 14.0) but not "
                   "classified in src/guard/2_table/classification.tsv"], bad


def test_the_criterion_finds_the_ranked_list(found):
    for name, reason in [("cuMemPoolSetAccess", "location:map"), ("cudaMemPoolSetAccess", "location:descList"),
                         ("cuDeviceGetDefaultMemPool", "device:dev"), ("cuMemGetDefaultMemPool", "location:location"),
                         ("cuMemcpy3DPeer", "peer:pCopy"), ("cudaMemcpy3DPeer", "location:p"),
                         ("cuMulticastAddDevice", "device:dev"), ("cuMulticastBindMem", "device:dev"),
                         ("cuGreenCtxCreate", "creates-context"), ("cudaDeviceGetExecutionCtx", "creates-context"),
                         ("cuMemPrefetchBatchAsync", "location:prefetchLocs"),
                         ("cuGraphAddMemAllocNode", "location:nodeParams"),
                         ("cuMemGetHandleForAddressRange", "handle:handleType"),
                         ("cuImportExternalMemory", "handle:memHandleDesc"),
                         ("cudaSetValidDevices", "device:device_arr"),
                         ("cuDeviceGetP2PAttribute", "device:srcDevice")]:
        assert name in found and reason in found[name]["reasons"], (name, found.get(name))
    assert found["cuMemPrefetchBatchAsync"]["majors"] == ["13.x"]
    # not device-touching: stream and plain memory calls
    for name in ["cuStreamSynchronize", "cuMemAlloc", "cudaMalloc", "cuMemcpyHtoD", "cuCtxSynchronize"]:
        assert name not in found, name


def test_the_document_is_what_the_classification_renders(found, cls):
    doc = (ROOT / "docs" / "classification.md").read_text()
    assert doc == C.render(found, cls), "docs/classification.md is stale: run scripts/classification.py --write"
