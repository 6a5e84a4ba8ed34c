"""rankguard launch on the 8-GPU fake node: each child, asking the fake driver itself
through NVIDIA's cuda.bindings, sees exactly one GPU as cuda:0 and it is the planned one;
the rank environment; CPU blocks read back from /proc/self/status; supervision (first
failure, SIGTERM forwarding, SIGKILL of the launcher)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from _cli import CLI, alive, bus, child_cmd, children, clean_env, cli, sysroot, uuid, wait_for
from conftest import GUARD, LIB_GUARD


def launch(*args, env=None, **kw):
    return cli("launch", *args, env=env if env is not None else clean_env(FAKECUDA_GPUS="8"), **kw)


def sees_one(c: dict, i: int):
    """Child c sees exactly physical GPU i, as ordinal 0."""
    cuda = c["cuda"]
    assert cuda["init"] == 0 and cuda["count"] == 1, c
    assert cuda["devices"][0]["ordinal"] == 0
    assert cuda["devices"][0]["uuid"] == uuid(i), c
    assert cuda["devices"][0]["bus_id"] == bus(i), c


def test_four_ranks_each_see_their_planned_gpu():
    env = clean_env(FAKECUDA_GPUS="8")
    plan = json.loads(cli("plan", "--json", "--nproc-per-node", "4", env=env, check=True).stdout)
    p = launch("--nproc-per-node", "4", "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert len(kids) == 4
    jobs = {c["env"]["RANKGUARD_JOB"] for c in kids}
    ports = {c["env"]["MASTER_PORT"] for c in kids}
    assert len(jobs) == 1 and None not in jobs
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for i, (c, r) in enumerate(zip(kids, plan["ranks"])):
        e = c["env"]
        assert e["CUDA_VISIBLE_DEVICES"] == r["cuda_visible_devices"] == str(i)
        sees_one(c, i)
        assert c["cuda"]["devices"][0]["uuid"] == r["uuid"]
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == (str(i), str(i), "4", "4")
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["RANKGUARD_RANK_GPU"] == str(i)
        assert e["RANKGUARD_RANK_GPU_UUID"] == uuid(i)
        assert e["LD_PRELOAD"] == str(LIB_GUARD.resolve())
        assert e["OMP_NUM_THREADS"] is None


def test_uuid_entries_survive_verbatim():
    cvd = f"{uuid(6)},GPU-13,{uuid(1)}"
    env = clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES=cvd, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    p = launch("--nproc-per-node", "3", "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in kids] == [uuid(6), "GPU-13", uuid(1)]
    assert [c["env"]["RANKGUARD_RANK_GPU"] for c in kids] == [uuid(6), "GPU-13", uuid(1)]
    assert [c["env"]["RANKGUARD_RANK_GPU_UUID"] for c in kids] == [uuid(6), uuid(3), uuid(1)]
    assert {c["env"]["CUDA_DEVICE_ORDER"] for c in kids} == {"PCI_BUS_ID"}
    for c, i in zip(kids, (6, 3, 1)):
        sees_one(c, i)


def test_devices_select_positions_of_the_parent_list():
    env = clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="4,5,6,7")
    p = launch("--devices", "1,3", "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in kids] == ["5", "7"]
    sees_one(kids[0], 5)
    sees_one(kids[1], 7)
    # Without a parent list, positions are the driver's GPUs.
    p = launch("--nproc-per-node", "2", "--devices", "6,2", "--", *child_cmd())
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    sees_one(kids[0], 6)
    sees_one(kids[1], 2)


def test_mig_entries_one_per_rank():
    # CUDA enumerates at most one MIG instance per process, so the launcher asks the driver
    # about each entry on its own; each rank gets its entry verbatim.
    mig0 = "MIG-1200a11c-0000-4000-8000-000000000200"
    env = clean_env(FAKECUDA_GPUS="8", FAKECUDA_MIG="2:2", CUDA_VISIBLE_DEVICES=f"{mig0},MIG-1201a11c")
    plan = json.loads(cli("plan", "--json", "--nproc-per-node", "gpu", env=env, check=True).stdout)
    assert [r["uuid"] for r in plan["ranks"]] == [mig0, "MIG-1201a11c-0000-4000-8000-000000000201"]
    assert {r["bus_id"] for r in plan["ranks"]} == {bus(2)}
    p = launch("--nproc-per-node", "gpu", "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in kids] == [mig0, "MIG-1201a11c"]
    for c, r in zip(kids, plan["ranks"]):
        assert c["cuda"]["count"] == 1
        assert "MIG-" + c["cuda"]["devices"][0]["uuid_v2"] == r["uuid"]
    env["CUDA_VISIBLE_DEVICES"] = f"{mig0},MIG-1299"
    p = cli("plan", "--nproc-per-node", "gpu", env=env)
    assert p.returncode == 2 and "entry 'MIG-1299' is not a device of this node" in p.stderr


def test_ld_preload_keeps_what_was_there_and_job_is_kept(tmp_path):
    other = tmp_path / "libother.so"
    other.write_bytes(b"")
    env = clean_env(FAKECUDA_GPUS="8", LD_PRELOAD=f"{GUARD}:{other}", RANKGUARD_JOB="job-42")
    # The launcher itself runs under the guard here, with 8 GPUs visible: its driver query
    # must not be the guard's business (it runs in a helper without the guard).
    p = launch("--nproc-per-node", "1", "--", *child_cmd("--no-cuda"), env=env)
    assert p.returncode == 0, p.stderr
    (c,) = children(p.stdout)
    assert c["env"]["LD_PRELOAD"] == f"{LIB_GUARD.resolve()}:{other}"
    assert c["env"]["RANKGUARD_JOB"] == "job-42"


def test_job_is_unique_per_launch():
    jobs = set()
    for _ in range(2):
        p = launch("--nproc-per-node", "1", "--", *child_cmd("--no-cuda"))
        (c,) = children(p.stdout)
        jobs.add(c["env"]["RANKGUARD_JOB"])
    assert len(jobs) == 2


@pytest.mark.parametrize("env,args", [
    ({"CUDA_VISIBLE_DEVICES": "3"}, ["--nproc-per-node", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "3"}, ["--devices", "1"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ["--devices", "2"]),
    ({}, ["--devices", "1,1"]),
    ({}, ["--nproc-per-node", "3", "--devices", "0,1"]),
    ({}, ["--nproc-per-node", "9"]),
])
def test_conflicts_fail_before_any_child_starts(tmp_path, env, args):
    p = launch(*args, "--", *child_cmd("--pid-dir", str(tmp_path)), env=clean_env(FAKECUDA_GPUS="8", **env))
    assert p.returncode == 2
    assert "rankguard: error:" in p.stderr
    assert ("CUDA_VISIBLE_DEVICES=" in p.stderr) or ("the driver (8 GPUs" in p.stderr), p.stderr
    assert list(tmp_path.iterdir()) == [], "a child started"
    assert children(p.stdout) == []


def _two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs a launcher affinity of at least 2 CPUs")
    return cpus[:2]


def test_auto_cpu_blocks_are_local_disjoint_and_inherited(tmp_path):
    a, b = _two_cpus()
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS=f"{a},{b}", FAKECUDA_NUMA_NODES="2")
    env = clean_env(FAKECUDA_GPUS="8", FAKECUDA_NUMA_NODES="2")
    p = launch("--devices", "0,4", "--cpu-ids", "auto", "--sysroot", str(root), "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    assert "NUMA-local" in p.stderr
    kids = children(p.stdout)
    assert [c["cpus_allowed_list"] for c in kids] == [str(a), str(b)]
    assert [c["threads_affinity"] for c in kids] == [[a], [b]]
    assert [c["env"]["OMP_NUM_THREADS"] for c in kids] == ["1", "1"]
    # Explicit blocks, in the order given.
    p = launch("--devices", "0,4", "--cpu-ids", f"{b},{a}", "--", *child_cmd("--no-cuda"))
    assert p.returncode == 0, p.stderr
    assert [c["cpus_allowed_list"] for c in children(p.stdout)] == [str(b), str(a)]
    # A user's OMP_NUM_THREADS is kept.
    env = clean_env(FAKECUDA_GPUS="8", OMP_NUM_THREADS="7")
    p = launch("--devices", "0,4", "--cpu-ids", "auto", "--sysroot", str(root), "--", *child_cmd("--no-cuda"), env=env)
    assert [c["env"]["OMP_NUM_THREADS"] for c in children(p.stdout)] == ["7", "7"]


def test_auto_blocks_stay_inside_the_launchers_affinity(tmp_path):
    a, b = _two_cpus()
    root = sysroot(tmp_path, FAKECUDA_GPUS="8", FAKECUDA_CPUS=f"{a},{b}", FAKECUDA_NUMA_NODES="2")
    only_a = lambda: os.sched_setaffinity(0, {a})  # noqa: E731
    cmd = [str(CLI), "launch", "--devices", "0", "--cpu-ids", "auto", "--sysroot", str(root), "--", *child_cmd("--no-cuda")]
    p = subprocess.run(cmd, env=clean_env(FAKECUDA_GPUS="8"), capture_output=True, text=True, timeout=60,
                       preexec_fn=only_a)
    assert p.returncode == 0, p.stderr
    (c,) = children(p.stdout)
    assert c["cpus_allowed_list"] == str(a)
    # Explicit blocks outside the launcher's affinity are refused before any child starts.
    cmd = [str(CLI), "launch", "--devices", "0,4", "--cpu-ids", f"{a},{b}", "--", *child_cmd("--pid-dir", str(tmp_path))]
    p = subprocess.run(cmd, env=clean_env(FAKECUDA_GPUS="8"), capture_output=True, text=True, timeout=60,
                       preexec_fn=only_a)
    assert p.returncode == 2
    assert f"block 1 ({b}) is outside the launcher's own CPU affinity ({a})" in p.stderr
    assert not list(tmp_path.glob("*.pid"))


def _pids(d, pattern="*.pid"):
    return [int(f.read_text()) for f in sorted(d.glob(pattern))]


def test_first_failing_rank_stops_the_others_and_sets_the_status(tmp_path):
    t0 = time.monotonic()
    p = launch("--nproc-per-node", "3", "--grace-period", "3", "--",
               *child_cmd("--no-cuda", "--pid-dir", str(tmp_path), "--sleep", "600", "--exit", "3", "--exit-if-rank", "1"),
               timeout=60)
    assert p.returncode == 3, p.stderr
    assert time.monotonic() - t0 < 30
    assert "rank 1" in p.stderr and "exited with status 3" in p.stderr
    pids = _pids(tmp_path)
    assert len(pids) == 3
    assert not any(alive(pid) for pid in pids)


def test_a_rank_killed_by_a_signal_reports_128_plus_it(tmp_path):
    p = launch("--nproc-per-node", "2", "--grace-period", "1", "--",
               "sh", "-c", 'if [ "$RANK" = 0 ]; then kill -KILL $$; else sleep 600; fi', timeout=60)
    assert p.returncode == 128 + 9, p.stderr
    assert "killed by signal 9" in p.stderr


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    t0 = time.monotonic()
    p = launch("--nproc-per-node", "2", "--grace-period", "1", "--",
               "sh", "-c", 'if [ "$RANK" = 0 ]; then sleep 1; exit 5; else trap "" TERM; while :; do sleep 1; done; fi',
               timeout=60)
    assert p.returncode == 5, p.stderr
    assert "grace period over" in p.stderr
    assert time.monotonic() - t0 < 20


def _start(tmp_path, *extra):
    proc = subprocess.Popen([str(CLI), "launch", "--nproc-per-node", "2", "--grace-period", "5", "--",
                             *child_cmd("--no-cuda", "--pid-dir", str(tmp_path), "--spawn", "--sleep", "600", *extra)],
                            env=clean_env(FAKECUDA_GPUS="8"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    # The child renames each pid file into place whole (_cli_child.record).
    written = lambda pattern: len(list(tmp_path.glob(pattern))) == 2
    assert wait_for(lambda: written("*.grand") and written("*.pid")), "ranks did not start"
    return proc, _pids(tmp_path), _pids(tmp_path, "*.grand")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_ends_every_child(tmp_path, sig):
    proc, pids, grands = _start(tmp_path)
    assert all(alive(p) for p in pids + grands)
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    assert rc == 128 + sig
    assert wait_for(lambda: not any(alive(p) for p in pids + grands), timeout=10)


def test_sigkill_of_the_launcher_leaves_no_child_running(tmp_path):
    proc, pids, grands = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    # PR_SET_PDEATHSIG takes the ranks, the reaper their process groups.
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=10), "a rank outlived the launcher"
    assert wait_for(lambda: not any(alive(p) for p in grands), timeout=10), "a rank's child outlived the launcher"


def test_prefix_output_tags_each_line_with_the_rank():
    p = launch("--nproc-per-node", "2", "--prefix-output", "--",
               "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2; printf "tail $RANK"')
    assert p.returncode == 0, p.stderr
    out = sorted(p.stdout.splitlines())
    assert out == ["[rank 0] out 0", "[rank 0] tail 0", "[rank 1] out 1", "[rank 1] tail 1"]
    assert "[rank 0] err 0" in p.stderr.splitlines() and "[rank 1] err 1" in p.stderr.splitlines()


def test_output_relay_does_not_wait_for_leftover_descendants(tmp_path):
    # A rank's background process keeps the relay pipe open; the launcher still ends, and
    # takes the leftover with it.
    t0 = time.monotonic()
    p = launch("--nproc-per-node", "1", "--prefix-output", "--",
               "sh", "-c", f'sleep 600 & echo $! > {tmp_path}/bg; echo hi', timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[rank 0] hi"]
    assert time.monotonic() - t0 < 15
    bg = int((tmp_path / "bg").read_text())
    assert wait_for(lambda: not alive(bg), timeout=10)


def test_multi_node_rank_environment():
    p = launch("--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
               "--master-port", "29501", "--", *child_cmd("--no-cuda"))
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert [(c["env"]["RANK"], c["env"]["LOCAL_RANK"], c["env"]["GROUP_RANK"]) for c in kids] == \
        [("2", "0", "1"), ("3", "1", "1")]
    assert {(c["env"]["WORLD_SIZE"], c["env"]["LOCAL_WORLD_SIZE"], c["env"]["MASTER_ADDR"], c["env"]["MASTER_PORT"])
            for c in kids} == {("4", "2", "10.1.2.3", "29501")}


def test_plan_into_a_closed_pipe_does_not_panic():
    p = subprocess.run(f"'{CLI}' plan --nproc-per-node 8 | head -c 1", shell=True, env=clean_env(FAKECUDA_GPUS="8"),
                       capture_output=True, text=True, timeout=60)
    assert "panicked" not in p.stderr


def _start_with_escapee(tmp_path):
    """Two ranks; each starts a helper in a new session (setsid: outside the rank's process
    group, as daemons do) whose pid it records, then sleeps. Issue 14, item 11."""
    script = (f'setsid sh -c \'echo $$ > {tmp_path}/$RANK.escapee; exec sleep 302\' & '
              f'echo $$ > {tmp_path}/$RANK.pid; sleep 600')
    proc = subprocess.Popen([str(CLI), "launch", "--nproc-per-node", "2", "--grace-period", "2", "--",
                             "sh", "-c", script],
                            env=clean_env(FAKECUDA_GPUS="8"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    assert wait_for(lambda: len(list(tmp_path.glob("*.escapee"))) == 2 and len(list(tmp_path.glob("*.pid"))) == 2), \
        "ranks did not start"
    time.sleep(0.5)  # let the reaper see the escapees at least once
    escapees = _pids(tmp_path, "*.escapee")
    assert all(alive(p) for p in escapees)
    # They really left the ranks' process groups.
    assert all(os.getpgid(e) == e for e in escapees)
    return proc, _pids(tmp_path), escapees


def _kill_leftovers(pids):
    """A failing test must not leave its escapees running on the machine."""
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_ends_descendants_in_other_sessions(tmp_path, sig):
    proc, pids, escapees = _start_with_escapee(tmp_path)
    try:
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
        assert wait_for(lambda: not any(alive(p) for p in pids + escapees), timeout=10), \
            "an escapee outlived the launcher"
    finally:
        _kill_leftovers(escapees)


def test_sigkill_of_the_launcher_ends_descendants_in_other_sessions(tmp_path):
    proc, pids, escapees = _start_with_escapee(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        assert wait_for(lambda: not any(alive(p) for p in pids), timeout=10), "a rank outlived the launcher"
        assert wait_for(lambda: not any(alive(p) for p in escapees), timeout=10), "an escapee outlived the launcher"
    finally:
        _kill_leftovers(escapees)


def test_an_orphaned_escapee_is_ended_when_the_job_ends(tmp_path):
    """The rank exits normally right after starting a setsid helper: the helper is orphaned
    (re-parented to the launcher, a child subreaper) and ended with the job."""
    script = f'setsid sh -c \'echo $$ > {tmp_path}/$RANK.escapee; exec sleep 302\' & sleep 0.5'
    p = launch("--nproc-per-node", "1", "--", "sh", "-c", script, timeout=60)
    assert p.returncode == 0, p.stderr
    (escapee,) = _pids(tmp_path, "*.escapee")
    try:
        assert wait_for(lambda: not alive(escapee), timeout=10), "an escapee outlived a finished job"
    finally:
        _kill_leftovers([escapee])


def test_the_reaper_only_ever_kills_descendants_of_its_live_launcher():
    """Safety of the escapee memory: a reaper whose named launcher is not its parent (the
    launcher died before it started, or a reused pid) must kill nothing when its pipe
    closes; here its parent is this test process, whose other child must survive."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        reaper = subprocess.Popen([str(CLI), "__reaper", "1"], stdin=subprocess.PIPE, env=clean_env())
        time.sleep(0.5)  # several 100 ms rounds of the reaper's look at the tree
        reaper.stdin.close()
        assert reaper.wait(timeout=10) == 0
        assert alive(bystander.pid), "the reaper killed a process that was not its launcher's"
    finally:
        bystander.kill()
        bystander.wait()


def test_the_launch_plans_from_the_drivers_whole_answer(tmp_path):
    """The driver query helper ends its answer with a line of its own: the launcher plans
    from it, not from the end of the helper's output, which the driver's teardown can keep
    open (here the fake's FAKECUDA_INIT_HOLD: a process holding the answer's pipe for
    120 s; a launcher reading to the end would wait that long). What the helper left
    behind is killed with the launch's other leftovers."""
    marker = f"RG_HOLD_{os.getpid()}_{tmp_path.name}"
    env = clean_env(FAKECUDA_INIT_HOLD="120", **{marker: "1"})
    p = cli("launch", "--nproc-per-node", "2", "--", "true", env=env, timeout=60)
    assert p.returncode == 0, p.stderr

    def has_marker(pid: str) -> bool:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return marker.encode() + b"=" in f.read()
        except OSError:
            return False
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and has_marker(pid)]
    assert left == [], f"processes of the launch still running: {left}"
