"""fakecuda-smi: the fake node's `nvidia-smi -L` and its topology files (--sysroot).

Why: rankguard's launcher reads a node's GPUs and NUMA layout from these views; on the
fake node they must agree with what the fake driver enumerates (checked here through
NVIDIA's cuda.bindings, code nobody here wrote) and have the shapes of the real ones.
"""
from __future__ import annotations

import json
import pathlib
import re
import textwrap

import pytest

from conftest import FAKE, PYTHON, clean_env, run

SMI = FAKE / "fakecuda-smi"
LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\)$")
MIG_LINE = re.compile(r"^  MIG (\S+) +Device +(\d+): \(UUID: (MIG-[0-9a-f-]{36})\)$")


def gpu_uuid(i: int) -> str:
    return f"GPU-{0x10 + i:02x}c0ffee-0000-4000-8000-{i:012x}"


def mig_uuid(i: int, j: int) -> str:
    return f"MIG-{0x10 + i:02x}{j:02x}a11c-0000-4000-8000-{i * 256 + j:012x}"


def smi(*args, **env):
    assert SMI.exists(), f"{SMI} is missing: `make -C c-tests`"
    return run([SMI, *args], env=clean_env(**env))


def driver_view(**env) -> list[tuple[str, str]]:
    """(name, uuid) of each device the fake driver enumerates, through cuda.bindings."""
    script = textwrap.dedent("""
        from cuda.bindings import driver as d
        err, = d.cuInit(0)
        if err == d.CUresult.CUDA_ERROR_NO_DEVICE:
            raise SystemExit(0)
        assert err == d.CUresult.CUDA_SUCCESS, err
        err, n = d.cuDeviceGetCount()
        for i in range(n):
            err, dev = d.cuDeviceGet(i)
            err, name = d.cuDeviceGetName(256, dev)
            err, u = d.cuDeviceGetUuid_v2(dev)
            h = bytes(u.bytes).hex()
            print(name.split(b"\\0")[0].decode() + "|" +
                  f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    """)
    p = run([PYTHON, "-c", script], env=clean_env(**env), timeout=120)
    assert p.returncode == 0, p.stderr
    return [tuple(l.split("|")) for l in p.stdout.splitlines()]


def parse_list(out: str):
    gpus = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            gpus.append({"index": int(m[1]), "name": m[2], "uuid": m[3], "mig": []})
            continue
        m = MIG_LINE.match(line)
        assert m and gpus, f"unexpected line in -L output: {line!r}"
        gpus[-1]["mig"].append((m[1], int(m[2]), m[3]))
    return gpus


# ---- -L ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [8, 4])
def test_list_matches_the_driver(n):
    env = {} if n == 8 else {"FAKECUDA_GPUS": str(n)}
    p = smi("-L", **env)
    assert p.returncode == 0, p.stderr
    gpus = parse_list(p.stdout)
    assert [g["index"] for g in gpus] == list(range(n))
    assert [g["uuid"] for g in gpus] == [gpu_uuid(i) for i in range(n)]
    view = driver_view(CUDA_DEVICE_ORDER="PCI_BUS_ID", **env)
    assert [(g["name"], g["uuid"][4:]) for g in gpus] == view
    assert all(not g["mig"] for g in gpus)


def test_list_ignores_cuda_visible_devices():
    plain = smi("-L", FAKECUDA_GPUS="4")
    for cvd in ["", "2", "GPU-13", "-1"]:
        p = smi("-L", FAKECUDA_GPUS="4", CUDA_VISIBLE_DEVICES=cvd)
        assert p.returncode == 0 and p.stdout == plain.stdout, (cvd, p.stdout, p.stderr)


def test_list_shows_mig_devices_like_nvidia_smi():
    p = smi("-L", FAKECUDA_GPUS="4", FAKECUDA_MIG="1:2;3:7")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1] == f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {gpu_uuid(1)})"
    assert re.fullmatch(rf"  MIG \S+ +Device  0: \(UUID: {mig_uuid(1, 0)}\)", lines[2])
    assert lines[6] == f"  MIG 1g.10gb     Device  0: (UUID: {mig_uuid(3, 0)})"
    gpus = parse_list(p.stdout)
    assert [len(g["mig"]) for g in gpus] == [0, 2, 0, 7]
    assert [g["uuid"] for g in gpus] == [gpu_uuid(i) for i in range(4)]
    # The driver agrees: each listed MIG UUID, given as CUDA_VISIBLE_DEVICES, enumerates
    # as exactly that device, whose name ends in " MIG <the listed profile>".
    for i, g in enumerate(gpus):
        assert [(j, u) for _, j, u in g["mig"]] == [(j, mig_uuid(i, j)) for j in range(len(g["mig"]))]
        for profile, j, uuid in g["mig"]:
            view = driver_view(FAKECUDA_GPUS="4", FAKECUDA_MIG="1:2;3:7",
                               CUDA_VISIBLE_DEVICES=uuid)
            assert view == [(f"NVIDIA H100 80GB HBM3 MIG {profile}", uuid[4:])], (uuid, view)


def test_bad_mig_layout_is_a_clear_error():
    p = smi("-L", FAKECUDA_GPUS="4", FAKECUDA_MIG="9:2")
    assert p.returncode == 2
    assert 'FAKECUDA_MIG="9:2" is invalid' in p.stderr


def test_json_agrees_with_list():
    env = {"FAKECUDA_GPUS": "4", "FAKECUDA_MIG": "2:3"}
    p = smi("--json", **env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    listed = parse_list(smi("-L", **env).stdout)
    assert [(g["index"], g["name"], g["uuid"]) for g in data["gpus"]] == \
           [(g["index"], g["name"], g["uuid"]) for g in listed]
    assert [g["pci_bus_id"] for g in data["gpus"]] == [f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(4)]
    assert [m["uuid"] for m in data["gpus"][2]["mig"]] == [mig_uuid(2, j) for j in range(3)]
    assert [g["numa_node"] for g in data["gpus"]] == [0, 0, 1, 1]


# ---- arguments ---------------------------------------------------------------------

def test_help():
    p = smi("--help")
    assert p.returncode == 0 and "--sysroot DIR" in p.stdout and "-L" in p.stdout


@pytest.mark.parametrize("args,needle", [
    ([], "usage:"),
    (["--bogus"], 'unknown argument "--bogus"'),
    (["--sysroot"], "--sysroot needs a directory"),
    (["--sysroot="], "--sysroot needs a non-empty directory"),
    (["-L", "--json"], "give one of"),
])
def test_bad_arguments(args, needle):
    p = smi(*args)
    assert p.returncode == 2, p
    assert needle in p.stderr


# ---- --sysroot -----------------------------------------------------------------------

def cpulist(text: str) -> list[int]:
    out = []
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def read(root: pathlib.Path, rel: str) -> str:
    return (root / rel).read_text()


def check_tree(root: pathlib.Path, n_gpus: int, numa_nodes: int, cpus: list[int]):
    online = read(root, "sys/devices/system/node/online").strip()
    assert cpulist(online) == list(range(numa_nodes))
    blocks = [cpulist(read(root, f"sys/devices/system/node/node{k}/cpulist"))
              for k in range(numa_nodes)]
    assert not (root / f"sys/devices/system/node/node{numa_nodes}").exists()
    flat = [c for b in blocks for c in b]
    assert sorted(flat) == sorted(cpus), "node cpulists must cover the CPUs"
    assert len(set(flat)) == len(flat), "node cpulists must be disjoint"
    assert flat == sorted(flat), "blocks are contiguous and in node order"
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True), sizes

    gpu_dirs = sorted((root / "proc/driver/nvidia/gpus").iterdir())
    assert [d.name for d in gpu_dirs] == [f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(n_gpus)]
    for i, d in enumerate(gpu_dirs):
        info = d.joinpath("information").read_text()
        fields = dict(re.match(r"^([^:]+):\s*(.*)$", l).groups() for l in info.splitlines())
        assert list(fields) == ["Model", "IRQ", "GPU UUID", "Video BIOS", "Bus Type",
                                "DMA Size", "DMA Mask", "Bus Location", "Device Minor",
                                "GPU Excluded"]
        assert info.startswith("Model: \t\t NVIDIA H100 80GB HBM3\n")
        assert fields["GPU UUID"] == gpu_uuid(i)
        assert fields["Bus Location"] == d.name
        assert fields["Device Minor"] == str(i)
        assert f"Bus Location: \t {d.name}\n" in info
        pci = root / "sys/bus/pci/devices" / d.name
        numa = int(pci.joinpath("numa_node").read_text())
        assert numa == i * numa_nodes // n_gpus, f"GPU {i} on NUMA node {numa}"
        assert cpulist(pci.joinpath("local_cpulist").read_text()) == blocks[numa]


def test_sysroot_two_numa_nodes(tmp_path):
    p = smi("--sysroot", tmp_path, FAKECUDA_CPUS="0-15")
    assert p.returncode == 0, p.stderr
    check_tree(tmp_path, 8, 2, list(range(16)))
    assert read(tmp_path, "sys/devices/system/node/node0/cpulist") == "0-7\n"
    assert read(tmp_path, "sys/devices/system/node/node1/cpulist") == "8-15\n"
    assert read(tmp_path, "sys/devices/system/node/online") == "0-1\n"


def test_sysroot_uneven_split(tmp_path):
    p = smi(f"--sysroot={tmp_path}", FAKECUDA_CPUS="0-9,20-24", FAKECUDA_NUMA_NODES="4",
            FAKECUDA_GPUS="4")
    assert p.returncode == 0, p.stderr
    cpus = list(range(10)) + list(range(20, 25))
    check_tree(tmp_path, 4, 4, cpus)
    assert read(tmp_path, "sys/devices/system/node/node2/cpulist") == "8-9,20-21\n"


def test_sysroot_defaults_to_this_machines_cpus(tmp_path):
    p = smi("--sysroot", tmp_path, FAKECUDA_NUMA_NODES="1", FAKECUDA_GPUS="2")
    assert p.returncode == 0, p.stderr
    online = cpulist(pathlib.Path("/sys/devices/system/cpu/online").read_text())
    check_tree(tmp_path, 2, 1, online)
    assert read(tmp_path, "sys/devices/system/node/online") == "0\n"


@pytest.mark.parametrize("env,needle", [
    ({"FAKECUDA_CPUS": "abc"}, 'FAKECUDA_CPUS="abc" is not a cpulist'),
    ({"FAKECUDA_CPUS": "4-2"}, "a range runs backwards"),
    ({"FAKECUDA_CPUS": "0-1", "FAKECUDA_NUMA_NODES": "4"}, "every NUMA node needs at least one CPU"),
    ({"FAKECUDA_NUMA_NODES": "0"}, 'FAKECUDA_NUMA_NODES="0" is invalid'),
])
def test_sysroot_bad_input(tmp_path, env, needle):
    p = smi("--sysroot", tmp_path, **env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr


def test_sysroot_on_a_file_fails(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = smi("--sysroot", f, FAKECUDA_CPUS="0-3")
    assert p.returncode == 1
    assert "cannot create directory" in p.stderr
