"""CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER conformance of the fake driver.

Every row of c-tests/cvd-vectors.tsv (shared with the guard's parser) runs through
c-tests/build/tests/fake_drv_enum, which prints what libcuda.so.1 enumerates, identified
by UUID alone. Cases whose answer depends on decisions the fake documents but the shared
vectors leave out (MIG enumeration without a MIG UUID, FASTEST_FIRST ordering on a
heterogeneous node) are tabled here, each naming its rule in c-tests/fake/driver/cvd.c.
"""
from __future__ import annotations

import pytest

from conftest import ROOT, TESTS, clean_env, run

ENUM = TESTS / "fake_drv_enum"
VECTORS = ROOT / "c-tests" / "cvd-vectors.tsv"


def _rows():
    rows = []
    for n, line in enumerate(VECTORS.read_text().splitlines(), 1):
        if line.startswith("#") or not line.strip():
            continue
        cols = line.split("\t")
        assert len(cols) == 4, f"cvd-vectors.tsv line {n}: want 4 tab-separated columns"
        rows.append(pytest.param(*cols, id=f"L{n}:{cols[0]}gpu:{cols[1]}:{cols[2]!r}"))
    return rows


def enumerate_devices(gpus: str, mig: str, cvd: str | None, **extra: str | None):
    env = clean_env(FAKECUDA_GPUS=gpus, FAKECUDA_MIG=None if mig == "-" else mig,
                    CUDA_VISIBLE_DEVICES=cvd, **extra)
    p = run([ENUM], env=env, check=True)
    out = {}
    for line in p.stdout.splitlines():
        key, _, rest = line.partition(" ")
        out.setdefault(key, []).append(rest)
    return out, p


@pytest.mark.parametrize("gpus,mig,cvd,expected", _rows())
def test_vector(gpus, mig, cvd, expected):
    value = {"<unset>": None, "<empty>": ""}.get(cvd, cvd)
    out, p = enumerate_devices(gpus, mig, value)
    assert out["enum"] == [expected], p.stdout
    if expected == "-":
        # Nothing visible: cuInit says so, and the driver stays in that state.
        assert out["init"] == ["100"], p.stdout
        assert out["count-after-failed-init"] == ["100"], p.stdout
    else:
        assert out["init"] == ["0"], p.stdout
        assert out["count"] == [str(len(expected.split(",")))]
        # One past the last ordinal is CUDA_ERROR_INVALID_DEVICE (101).
        assert out["get-out-of-range"] == ["101"], p.stdout


def test_vectors_cover_every_rule():
    text = VECTORS.read_text()
    for needle in ["<unset>", "<empty>", "-1", "1gpu2", "0,1,2,1", "GPU-12\t", "GPU-1\t",
                   "MIG-GPU-", "MIG-11\t", " 3, 5", "GPU-12,GPU-12c0ffee"]:
        assert needle in text, f"cvd-vectors.tsv lost its case for {needle!r}"


# Decisions of c-tests/fake/driver/cvd.c beyond the shared vectors (README "Known
# differences"): (gpus, mig, cvd, expected, rule).
DRIVER_ONLY = [
    ("4", "1:2", None, "0,2,3,1/0", "D-migenum + D-fastest (the MIG slice is slower)"),
    ("4", "1:2", "3", "1/0", "D-migenum: an index names the MIG GPU's instance 0"),
    ("4", "1:2", "GPU-11", "1/0", "D-migenum: a MIG GPU's own UUID names instance 0"),
    ("4", "1:2", "MIG-1100,MIG-1101", "1/0", "D-mig1: one MIG device per process"),
    ("4", "1:2;3:3", None, "0,2,1/0", "D-mig1: the second MIG GPU is dropped"),
    ("4", "1:2", "MIG-1101,MIG-1100", "1/1", "D-mig1 keeps the first in list order"),
    ("8", "-", " GPU-12", "-", "D-uuidsp: a leading space makes it an index entry"),
    ("8", "-", "GPU-12 ,GPU-15", "-", "D-uuidsp: UUID entries are not trimmed"),
    ("8", "-", "gpu-12", "-", "D-uuidsp: case-sensitive"),
]


@pytest.mark.parametrize("gpus,mig,cvd,expected,rule", DRIVER_ONLY,
                         ids=[f"{r[2]!r}-{r[4].split(':')[0]}" for r in DRIVER_ONLY])
def test_driver_decision(gpus, mig, cvd, expected, rule):
    out, p = enumerate_devices(gpus, mig, cvd)
    assert out["enum"] == [expected], f"{rule}\n{p.stdout}"


def test_identities_pci_numa_and_mig_names():
    out, p = enumerate_devices("8", "5:7", None, FAKECUDA_NUMA_NODES="4",
                               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    devs = [d.split(" ", 7) for d in out["dev"]]
    assert len(devs) == 8
    for i, (ordinal, u2, u1, pci, numa, hnuma, sms, name) in enumerate(devs):
        assert ordinal == str(i)
        assert pci == f"0000:{0x18 + 0x10 * i:02x}:00.0"
        assert numa == hnuma == str(i * 4 // 8)
        if i == 5:
            assert u2 == "MIG-1500a11c-0000-4000-8000-000000000500"
            # cuDeviceGetUuid (v1) of a MIG device: the parent GPU (D-uuidv1)
            assert u1 == "GPU-15c0ffee-0000-4000-8000-000000000005"
            assert name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb" and sms == "16"
        else:
            assert u2 == u1 == f"GPU-{0x10 + i:02x}c0ffee-0000-4000-8000-{i:012x}"
            assert name == "NVIDIA H100 80GB HBM3" and sms == "132"


def test_pci_bus_overflow_goes_to_domain():
    out, p = enumerate_devices("17", "-", "14,15,16")
    pcis = [d.split(" ")[3] for d in out["dev"]]
    assert pcis == ["0000:f8:00.0", "0001:08:00.0", "0001:18:00.0"], p.stdout


@pytest.fixture
def hetero(tmp_path):
    """GPU 2 and GPU 5 are faster; GPU 6 is slower; the rest default (H100, 132 SMs)."""
    topo = tmp_path / "topo.txt"
    topo.write_text("# heterogeneous node\n"
                    '2 name="NVIDIA H200" sms=144 mem_gib=141\n'
                    '5 name="NVIDIA H200" sms=144 mem_gib=141 numa=0\n'
                    "6 sms=66 clock_khz=1000000\n")
    return str(topo)


def test_device_order_fastest_first_vs_pci(hetero):
    out, _ = enumerate_devices("8", "-", None, FAKECUDA_TOPOLOGY=hetero)
    assert out["enum"] == ["2,5,0,1,3,4,7,6"]          # D-fastest: ties in PCI order
    out, _ = enumerate_devices("8", "-", None, FAKECUDA_TOPOLOGY=hetero,
                               CUDA_DEVICE_ORDER="FASTEST_FIRST")
    assert out["enum"] == ["2,5,0,1,3,4,7,6"]
    out, _ = enumerate_devices("8", "-", None, FAKECUDA_TOPOLOGY=hetero,
                               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert out["enum"] == ["0,1,2,3,4,5,6,7"]
    # An unknown order is ignored, as by the driver: FASTEST_FIRST.
    out, _ = enumerate_devices("8", "-", None, FAKECUDA_TOPOLOGY=hetero,
                               CUDA_DEVICE_ORDER="SLOWEST_FIRST")
    assert out["enum"] == ["2,5,0,1,3,4,7,6"]


def test_indices_follow_device_order_but_uuids_do_not(hetero):
    out, _ = enumerate_devices("8", "-", "0,1", FAKECUDA_TOPOLOGY=hetero)
    assert out["enum"] == ["2,5"]
    out, _ = enumerate_devices("8", "-", "0,1", FAKECUDA_TOPOLOGY=hetero,
                               CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert out["enum"] == ["0,1"]
    out, _ = enumerate_devices("8", "-", "GPU-10,GPU-11", FAKECUDA_TOPOLOGY=hetero)
    assert out["enum"] == ["0,1"]
    out, _ = enumerate_devices("8", "-", None, FAKECUDA_TOPOLOGY=hetero)
    names = [d.split(" ", 7)[7] for d in out["dev"]]
    assert names[:2] == ["NVIDIA H200", "NVIDIA H200"]


def test_env_is_read_once_at_cuinit():
    """The C program sets CUDA_VISIBLE_DEVICES after cuInit; the driver ignores it."""
    p = run([TESTS / "fake_drv_basic", "env-once"],
            env=clean_env(CUDA_VISIBLE_DEVICES="3,4"), check=True)
    assert "PASSED" in p.stdout
