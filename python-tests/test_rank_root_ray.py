"""Ray for real (issue 12): Ray (pinned in requirements.txt) starts 4 GPU actors on the
fake 8-GPU node with the guard given through runtime_env, exactly as the README's Ray
recipe does (this file runs that code block). Ray sets each actor's single-entry
CUDA_VISIBLE_DEVICES inside its worker before user code and no RANK: each actor must be its
own rank root on its own GPU, IPC between actors on different GPUs is traffic between
ranks (allowed), a subprocess of an actor re-pointed to another GPU is R1 and ends its
actor (the rank), and cuDeviceGet(1) in an actor is refused.

Ray runs on loopback only (checked), with one module-wide cluster that the fixture shuts
down, checking that none of its processes is left behind.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile
import time

import pytest

from _ipc import gpu_uuid
from conftest import CLI, FAKE, LIB_GUARD, ROOT, clean_env

ACTORS = 4
# A preload the cluster's workers already have: the recipe keeps it after the guard.
KEPT = "libanl.so.1"  # glibc's, loaded by nothing else here
TIMEOUT = 120
ray = None          # imported by the cluster fixture, once Ray's environment is set

# What the recipe's `...` stands for: the actor's work, driven by the tests below.
BODY = '''
    def setup(self):
        import os
        from cuda.bindings import driver as d
        assert int(d.cuInit(0)[0]) == 0
        dev = d.cuDeviceGet(0)[1]
        ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
        assert int(d.cuCtxSetCurrent(ctx)[0]) == 0
        self.d = d
        return {"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "preload": os.environ.get("LD_PRELOAD"), "maps": open("/proc/self/maps").read()}

    def device_get(self, ordinal):
        return int(self.d.cuDeviceGet(ordinal)[0])

    def export(self, size):
        d = self.d
        self.buf = d.cuMemAlloc(size)[1]
        d.cuMemcpyHtoD(self.buf, bytes(i * 7 % 251 for i in range(size)), size)
        return bytes(d.cuIpcGetMemHandle(self.buf)[1].reserved)

    def import_(self, handle, size):
        d = self.d
        h = d.CUipcMemHandle()
        h.reserved = handle
        err, p = d.cuIpcOpenMemHandle(h, d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        if int(err) != 0:
            return int(err), None
        out = bytearray(size)
        d.cuMemcpyDtoH(out, p, size)
        d.cuIpcCloseMemHandle(p)
        return 0, bytes(out) == bytes(i * 7 % 251 for i in range(size))

    def child(self, cvd):
        import os, subprocess, sys
        env = dict(os.environ)
        if cvd is not None:
            env["CUDA_VISIBLE_DEVICES"] = cvd
        code = "import sys; from cuda.bindings import driver as d; sys.exit(int(d.cuInit(0)[0]))"
        return subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode
'''


def recipe() -> str:
    """The README's Ray code block."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```python\n(# Ray:.*?)```", text, re.S)
    assert m, "README has no Ray recipe"
    return m.group(1)


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[0] != "Z":
                kids.setdefault(int(fields[1]), []).append(int(p.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _what(pid: int) -> str:
    """A process's command line, state and kernel wait channel, or why they cannot be read."""
    try:
        proc = pathlib.Path(f"/proc/{pid}")
        cmd = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        stat = proc.joinpath("stat").read_text()
        wchan = proc.joinpath("wchan").read_text()
        return f"{cmd[:120]!r} state {stat[stat.rfind(')') + 2]} in {wchan or '-'}"
    except OSError as e:
        return f"unreadable ({e.strerror})"


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    addrs = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:       # LISTEN
                addrs.append(f[1].split(":")[0])
    return addrs


# 127.0.0.1, ::1, ::ffff:127.0.0.1 as /proc/net/tcp{,6} print them
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Ray cluster on loopback whose workers see the fake 8-GPU node; the guard's audit
    and registry in a private directory. Environment the raylet (and so every worker)
    inherits is set for ray.init only."""
    tmp = tmp_path_factory.mktemp("ray")
    reg = tmp / "registry"
    reg.mkdir(mode=0o700)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env(
        FAKECUDA_GPUS="8", RANKGUARD_MODE="enforce", RANKGUARD_IPC="strict",
        RANKGUARD_REGISTRY=str(reg), RANKGUARD_AUDIT=str(tmp / "audit.%p.jsonl"),
        RAY_USAGE_STATS_ENABLED="0", LD_PRELOAD=KEPT, PATH=f"{CLI.parent}:{saved.get('PATH', '')}",
        # Ray's switch for a single-node cluster on loopback (read when ray is imported):
        # without it every Ray server listens on all interfaces.
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
    assert os.environ["LD_LIBRARY_PATH"] == str(FAKE)
    assert "rankguard" not in recipe().split("class Learner", 1)[1], "the actor's code names rankguard"
    global ray
    try:
        import ray as ray_module
        ray = ray_module
        assert not ray._private.ray_constants.ENABLE_RAY_CLUSTER, "ray was imported before its environment was set"
        # Ray's session (logs, sockets) in a short private directory (socket paths are
        # limited to 107 bytes), removed after shutdown
        session = tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp")
        ray.init(num_cpus=ACTORS, num_gpus=8, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, _temp_dir=session)
        ns = {"__name__": "readme_ray_recipe"}
        code = recipe()
        assert "    ...\n" in code
        exec(compile(code.replace("    ...\n", BODY), "README.md (Ray recipe)", "exec"), ns)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert ns["lib"] == str(LIB_GUARD)          # what `rankguard lib` hands out here
    try:
        yield tmp, ns["Learner"]
    finally:
        # everything Ray started below this process: GCS, raylet, the actors' workers
        ray_procs = _descendants(os.getpid())
        ray.shutdown()
        end = time.monotonic() + 60
        while time.monotonic() < end and (ray_procs & _descendants(os.getpid())):
            time.sleep(0.2)
        left = ray_procs & _descendants(os.getpid())
        shutil.rmtree(session, ignore_errors=True)
        # what each one is and where it stopped, for the failure message
        seen = {pid: _what(pid) for pid in sorted(left)}
        assert not left, f"Ray processes left behind after ray.shutdown(): {seen}"


@pytest.fixture(scope="module")
def actors(cluster):
    tmp, Learner = cluster
    handles = [Learner.remote() for _ in range(ACTORS)]
    info = ray.get([a.setup.remote() for a in handles], timeout=TIMEOUT)
    # loopback only, workers included
    addrs = _listening(_descendants(os.getpid()))
    assert addrs and set(addrs) <= LOOPBACK, f"Ray listens beyond loopback: {addrs}"
    return tmp, handles, info


def records(tmp) -> list[dict]:
    out = []
    for f in sorted(tmp.glob("audit.*.jsonl")):
        out += [r for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") != "map"]
    return out


def test_each_actor_is_its_own_rank_on_its_own_gpu(actors):
    tmp, handles, info = actors
    cvds = sorted(i["cvd"] for i in info)
    assert len(cvds) == ACTORS and len(set(cvds)) == ACTORS and all(c.isdigit() for c in cvds), info
    for i in info:  # injected by runtime_env alone, the worker's own preload kept after it
        assert i["preload"] == f"{LIB_GUARD}:{KEPT}", i["preload"]
        assert "librankguard.so" in i["maps"] and KEPT in i["maps"]
    # cuDeviceGet(1) in an actor is refused (R2, 101); each record names the actor as root
    assert ray.get([a.device_get.remote(1) for a in handles], timeout=TIMEOUT) == [101] * ACTORS
    assert ray.get([a.device_get.remote(0) for a in handles], timeout=TIMEOUT) == [0] * ACTORS
    r2 = [r for r in records(tmp) if r["rule"] == "R2"]
    assert len(r2) == ACTORS
    by_pid = {r["pid"]: r for r in r2}
    for i in info:
        rec = by_pid[i["pid"]]
        assert rec["verdict"] == "deny" and rec["rank"] is None and rec["job"] is None
        assert rec["rank_root"]["pid"] == i["pid"]          # the actor's process is the root
        assert rec["gpu"] == gpu_uuid(int(i["cvd"]))


def test_ipc_between_actors_on_different_gpus_is_allowed(actors):
    """Another rank's memory: allowed with every byte, under RANKGUARD_IPC=strict too (an
    exporter of unknown rank would be denied there)."""
    tmp, handles, info = actors
    size = 1 << 16
    handle = ray.get(handles[0].export.remote(size), timeout=TIMEOUT)
    for a in handles[1:]:
        assert ray.get(a.import_.remote(handle, size), timeout=TIMEOUT) == (0, True)
    assert [r for r in records(tmp) if r["rule"] == "R3"] == []


def test_a_subprocess_of_an_actor_on_another_gpu_is_r1(actors):
    """The subprocess is stopped at cuInit (R1) and, the actor being its rank (its rank
    root), ends the actor with it (issue 28): the actor's process ends with 78 and says why
    in its own log, and Ray reports the actor dead. The other actors run on."""
    tmp, handles, info = actors
    a, me = handles[0], info[0]
    other = str((int(me["cvd"]) + 4) % 8)
    assert ray.get(a.child.remote(None), timeout=TIMEOUT) == 0        # the actor's own GPU
    with pytest.raises(ray.exceptions.RayActorError) as died:         # stopped by R1, with its rank
        ray.get(a.child.remote(other), timeout=TIMEOUT)
    report = str(died.value)
    assert f"pid: {me['pid']}" in report and "worker process has died" in report, report
    r1 = [r for r in records(tmp) if r["rule"] == "R1"]
    assert len(r1) == 1 and r1[0]["verdict"] == "deny"
    assert r1[0]["rank_root"]["pid"] == me["pid"] and r1[0]["rank_gpu"] == gpu_uuid(int(me["cvd"]))
    assert r1[0]["sees"] == gpu_uuid(int(other))
    # the actor's line, in the log Ray keeps of its worker's stderr
    logs = pathlib.Path(ray._private.worker._global_node.get_logs_dir_path())
    err = "".join(f.read_text() for f in logs.glob(f"worker-*-{me['pid']}.err"))
    line = next((l for l in err.splitlines() if "ending this process, the rank's process" in l), None)
    assert line and f":{me['pid']}:" in line and "with status 78" in line and "broke R1" in line, err
    # the other actors are still there
    assert ray.get([h.device_get.remote(0) for h in handles[1:]], timeout=TIMEOUT) == [0] * (ACTORS - 1)
