"""Rule R3, no cross-device IPC inside a rank, across real processes on the fake platform.

Each test starts an exporter and an importer (c-tests/tests/ipc_peer.c) with their own
environments under librankguard.so, and checks what the importer got (the program checks
return codes and every byte itself), what the guard said on stderr, and the audit records.
Kinds: legacy memory handles through the driver (mem) and the runtime (rtmem), event
handles (event, rtevent), VMM POSIX fds (vmm; vmmhost is host memory), memory pools
(pool: the pool's fd, then one allocation's export data), and device memory shared
outside CUDA IPC: a dma-buf export (cuMemGetHandleForAddressRange) imported as external
memory through the driver (dmabuf) and the runtime (rtdmabuf), and a VMM fd imported as
external memory (extvmm).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

import _handle_table as handle_table
from _ipc import PEER, JOB, audit, exporter, gpu_uuid, guard_env
from conftest import FAKE, GUARD, run

KINDS = ["mem", "rtmem", "event", "rtevent", "vmm", "pool", "dmabuf", "rtdmabuf", "extvmm"]


def importer(tmp, kind, ex, env, expect, times=1):
    p = run([PEER, "import", kind, ex.dir, expect] + ([str(times)] if times > 1 else []), env=env)
    assert p.returncode == 0, f"importer failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


def r3_records(tmp):
    return [r for r in audit(tmp) if r.get("rule") == "R3"]


# ------------------------------------------------------------------ same rank, two GPUs

@pytest.mark.parametrize("kind", KINDS)
def test_same_rank_other_gpu_is_denied(tmp_path, kind):
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0)) as ex:
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "1", 0), "deny")
    assert "import-rc 800" in p.stdout
    line = next(l for l in p.stderr.splitlines() if "RANKGUARD DENY" in l)
    # the line names the call, the rule, both GPUs, the exporter's pid and the fix
    assert "denied" in line and "R3" in line
    assert gpu_uuid(0) in line and gpu_uuid(1) in line
    assert f"pid {ex.pid}" in line
    assert "fix:" in line.lower()
    (rec,) = r3_records(tmp_path)
    assert rec["verdict"] == "deny" and rec["mode"] == "enforce"
    assert rec["exporter_pid"] == ex.pid and rec["exporter_gpu"] == gpu_uuid(0)
    assert rec["gpu"] == gpu_uuid(1) and rec["rank"] == 0 and rec["exporter_rank"] == 0
    assert rec["job"] == JOB and rec["cvd"] == "1"
    # an event is not called memory
    shared = "an event" if kind in ("event", "rtevent") else "memory"
    assert rec["detail"].startswith(f"IPC import of {shared} exported on another GPU"), rec["detail"]


@pytest.mark.parametrize("kind", KINDS)
def test_same_rank_other_gpu_is_recorded_in_warn_mode(tmp_path, kind):
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0)) as ex:
        # warn mode lets it through: the importer still reads every byte
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "1", 0, RANKGUARD_MODE="warn"), "allow")
    assert "import-rc 0" in p.stdout
    recs = r3_records(tmp_path)
    # a pool is imported twice over: the pool's fd, then the pointer's export data
    assert len(recs) == (2 if kind == "pool" else 1), recs
    rec = recs[0]
    for field in ("call", "abi", "verdict", "rule", "mode", "pid", "rank", "job", "cvd", "gpu", "args", "detail"):
        assert field in rec, field
    assert rec["rule"] == "R3" and rec["verdict"] == "warn" and rec["mode"] == "warn"
    assert rec["exporter_pid"] == ex.pid and rec["exporter_gpu"] == gpu_uuid(0)
    assert rec["gpu"] == gpu_uuid(1)
    assert rec["handle"] == {"mem": "mem", "rtmem": "mem", "event": "event", "rtevent": "event",
                             "vmm": "vmmfd", "pool": "poolfd", "dmabuf": "dmabuf",
                             "rtdmabuf": "dmabuf", "extvmm": "vmmfd"}[kind]
    if kind == "pool":
        assert recs[1]["handle"] == "poolptr" and recs[1]["exporter_pid"] == ex.pid


@pytest.mark.parametrize("kind", KINDS)
def test_same_rank_same_gpu_is_allowed_with_every_byte(tmp_path, kind):
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0)) as ex:
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "0", 0, RANKGUARD_IPC="strict"), "allow")
    assert "import-rc 0" in p.stdout
    assert "RANKGUARD" not in p.stderr
    assert r3_records(tmp_path) == []


def test_the_same_gpu_named_by_uuid_is_the_same_gpu(tmp_path):
    with exporter(tmp_path, "mem", guard_env(tmp_path, "1", 2)) as ex:
        importer(tmp_path, "mem", ex, guard_env(tmp_path, gpu_uuid(1)[:12], 2, RANKGUARD_IPC="strict"), "allow")
    assert r3_records(tmp_path) == []


# ------------------------------------------------------------------ other ranks, host memory

@pytest.mark.parametrize("kind", KINDS)
def test_other_rank_on_other_gpu_is_allowed(tmp_path, kind):
    """The NCCL P2P pattern: rank 1 maps rank 0's buffer on another GPU."""
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0)) as ex:
        p = importer(tmp_path, kind, ex,
                     guard_env(tmp_path, "1", 1, RANKGUARD_IPC="strict", RANKGUARD_DEBUG="DEBUG"), "allow")
    assert "import-rc 0" in p.stdout
    assert "another rank" in p.stderr          # logged at debug level only
    assert "RANKGUARD WARN" not in p.stderr
    assert r3_records(tmp_path) == []


def test_another_job_is_not_this_rank(tmp_path):
    with exporter(tmp_path, "mem", guard_env(tmp_path, "0", 0)) as ex:
        importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0, RANKGUARD_JOB="other-job"), "allow")
    assert r3_records(tmp_path) == []


def test_job_from_the_engine(tmp_path):
    """Without the launcher's id, SLURM's job and step make the job."""
    slurm = dict(RANKGUARD_JOB=None, SLURM_JOB_ID="77", SLURM_STEP_ID="0")
    with exporter(tmp_path, "mem", guard_env(tmp_path, "0", 0, **slurm)) as ex:
        importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0, **slurm), "deny")
    (rec,) = r3_records(tmp_path)
    assert rec["exporter_job"] == "slurm:77.0"


def test_host_memory_vmm_is_always_allowed(tmp_path):
    with exporter(tmp_path, "vmmhost", guard_env(tmp_path, "0", 0)) as ex:
        p = importer(tmp_path, "vmmhost", ex, guard_env(tmp_path, "1", 0, RANKGUARD_IPC="strict"), "allow")
    assert "RANKGUARD" not in p.stderr
    assert r3_records(tmp_path) == []


def test_host_memory_vmm_of_an_unguarded_exporter_is_allowed_even_strict(tmp_path):
    """No record at all: the allocation's location type, asked after the import, decides."""
    with exporter(tmp_path, "vmmhost", guard_env(tmp_path, "0", 0, LD_PRELOAD=None)) as ex:
        importer(tmp_path, "vmmhost", ex, guard_env(tmp_path, "1", 0, RANKGUARD_IPC="strict"), "allow")
    assert r3_records(tmp_path) == []


def test_a_mapping_the_driver_reports_on_another_device_is_caught_after_the_fact(tmp_path):
    """No record (unguarded exporter on GPU 1); the importer sees GPUs 0 and 1 (warn mode
    lets that R1 breach run): after opening, the driver reports the mapping on device 1,
    not the rank's device 0, and R3 records it."""
    with exporter(tmp_path, "mem", guard_env(tmp_path, "1", 0, LD_PRELOAD=None)) as ex:
        importer(tmp_path, "mem", ex, guard_env(tmp_path, "0,1", 0, RANKGUARD_MODE="warn"), "allow")
    (rec,) = r3_records(tmp_path)
    assert rec["verdict"] == "warn" and rec["detail"] == "the imported mapping is on device 1, not the rank's device 0"
    assert rec["device"] == 1


# ------------------------------------------------------------------ unknown provenance

@pytest.mark.parametrize("kind", ["mem", "event", "vmm"])
def test_unknown_exporter_is_allowed_by_default(tmp_path, kind):
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0, LD_PRELOAD=None)) as ex:
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "1", 0), "allow")
    assert "RANKGUARD WARN" not in p.stderr
    assert r3_records(tmp_path) == []


@pytest.mark.parametrize("kind", ["mem", "rtmem", "event", "vmm", "dmabuf", "rtdmabuf"])
def test_unknown_exporter_is_denied_when_strict(tmp_path, kind):
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0, LD_PRELOAD=None)) as ex:
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "0", 0, RANKGUARD_IPC="strict"), "deny")
    assert "RANKGUARD_IPC=strict" in p.stderr
    (rec,) = r3_records(tmp_path)
    assert rec["verdict"] == "deny" and rec["exporter_pid"] is None
    assert "unknown provenance" in rec["detail"]


def test_off_mode_neither_records_nor_checks(tmp_path):
    with exporter(tmp_path, "mem", guard_env(tmp_path, "0", 0, RANKGUARD_MODE="off")) as ex:
        importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0, RANKGUARD_MODE="off"), "allow")
    assert not (tmp_path / "registry").exists() or not any((tmp_path / "registry").iterdir())
    assert r3_records(tmp_path) == []


def test_records_of_dead_exporters_are_cleaned_up(tmp_path):
    # An exporter's records go at its exit (test_export_records.py); one killed by a signal
    # runs no handler and leaves its record...
    reg = tmp_path / "registry"
    (tmp_path / "a").mkdir()
    a = subprocess.Popen([str(PEER), "export", "mem", str(tmp_path / "a")], env=guard_env(tmp_path, "0", 0),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert a.stdout.readline().strip() == "ready"
    a.kill()
    a.wait(timeout=30)
    # Its memory record is a slot of the handle table.
    stale = handle_table.names(reg)
    assert len(stale) == 1 and handle_table.records(reg)[0][0] == a.pid, stale
    with exporter(tmp_path, "mem", guard_env(tmp_path, "0", 0), name="b"):
        names = handle_table.names(reg)
    assert stale[0] not in names and len(names) == 1   # ...until the next exporter sweeps


# ------------------------------------------------------------------ registry attacks

def _say_once(stderr: str, needle: str):
    hits = [l for l in stderr.splitlines() if needle in l]
    assert len(hits) == 1, f"expected one line with {needle!r}:\n{stderr}"
    assert "RANKGUARD WARN" in hits[0]
    return hits[0]


def _untrusted_registry(tmp_path, reg_env: str):
    """Exporter and importer on a registry they must not trust: both say so once, nothing
    is trusted (a cross-GPU import of the same rank is unknown: allowed by default), and
    under strict the import is denied as unknown."""
    env_x = guard_env(tmp_path, "0", 0, RANKGUARD_REGISTRY=reg_env)
    with exporter(tmp_path, "mem", env_x) as ex:
        p = importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0, RANKGUARD_REGISTRY=reg_env), "allow", times=3)
        s = importer(tmp_path, "mem", ex, guard_env(tmp_path, "0", 0, RANKGUARD_REGISTRY=reg_env,
                                                    RANKGUARD_IPC="strict"), "deny")
    _say_once(p.stderr, "not trusted")
    _say_once(s.stderr, "not trusted")
    _say_once(ex.stderr, "not trusted")
    return p


def test_registry_owned_by_another_user_is_ignored(tmp_path):
    reg = tmp_path / "foreign"
    reg.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(reg, 65534, 65534)
        p = _untrusted_registry(tmp_path, str(reg))
        assert "owned by uid 65534" in p.stderr
    else:
        root_dir = "/root"
        if not os.path.isdir(root_dir) or os.stat(root_dir).st_uid == os.geteuid():
            pytest.skip("needs root to chown, or a directory of another user (/root)")
        p = _untrusted_registry(tmp_path, root_dir)
        assert "owned by uid" in p.stderr


def test_registry_with_group_or_other_access_is_ignored(tmp_path):
    reg = tmp_path / "open"
    reg.mkdir()
    reg.chmod(0o777)
    p = _untrusted_registry(tmp_path, str(reg))
    assert "mode 0777" in p.stderr


def test_symlinked_registry_is_ignored(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    p = _untrusted_registry(tmp_path, str(link))
    assert "symbolic link" in p.stderr
    assert not any(real.iterdir()), "nothing was written through the link"


def test_relative_registry_path_is_ignored(tmp_path):
    p = _untrusted_registry(tmp_path, "relative/registry")
    assert "not an absolute path" in p.stderr


def _tamper(tmp_path, change, expect_in_warning):
    """Export, tamper with the one record file, then import on the SAME GPU under strict: a
    trusted record would allow it; an untrusted one makes provenance unknown (denied). A
    VMM fd's record is a file (a 64-byte handle's is a slot of the handle table: below)."""
    reg = tmp_path / "registry"
    with exporter(tmp_path, "vmm", guard_env(tmp_path, "0", 0)) as ex:
        (rec,) = list(reg.iterdir())
        change(rec, ex)
        p = importer(tmp_path, "vmm", ex, guard_env(tmp_path, "0", 0, RANKGUARD_IPC="strict"), "deny", times=2)
    line = _say_once(p.stderr, "not trusted")
    assert expect_in_warning in line
    assert all(r["verdict"] == "deny" and r["exporter_pid"] is None for r in r3_records(tmp_path))
    return p


def test_garbage_record_is_skipped(tmp_path):
    _tamper(tmp_path, lambda rec, ex: rec.write_bytes(b"\x00\xffnot a record\n" * 10), "corrupt")


def test_truncated_record_is_skipped(tmp_path):
    def cut(rec, ex):
        text = rec.read_text()
        rec.write_text(text[: len(text) // 2])
    _tamper(tmp_path, cut, "truncated")


def test_oversized_record_is_skipped(tmp_path):
    _tamper(tmp_path, lambda rec, ex: rec.write_text(rec.read_text() + "x" * 4096), "larger than")


def test_forged_pid_is_skipped(tmp_path):
    """A record claiming a live process (pid 1) that is not the exporter."""
    def forge(rec, ex):
        rec.write_text(rec.read_text().replace(f"pid {ex.pid}\n", "pid 1\n"))
    _tamper(tmp_path, forge, "forged")


def test_symlinked_record_is_skipped(tmp_path):
    def link(rec, ex):
        copy = rec.parent.parent / "copy-of-record"
        shutil.copy(rec, copy)
        rec.unlink()
        rec.symlink_to(copy)
    _tamper(tmp_path, link, "symbolic link")


def test_record_writable_by_others_is_skipped(tmp_path):
    _tamper(tmp_path, lambda rec, ex: rec.chmod(0o666), "writable by others")


def _tamper_handle_table(tmp_path, kind, change, expect_in_warning):
    """A memory handle's or an event's record is a slot of the registry's handle table, not a
    file; tampered with there, it is not trusted either (provenance unknown: denied under
    strict), said once with the table's path, and its slot is emptied."""
    reg = tmp_path / "registry"
    with exporter(tmp_path, kind, guard_env(tmp_path, "0", 0)) as ex:
        assert os.listdir(reg) == ["handles.table"], "a slot, not a file"
        ((owner, _),) = handle_table.records(reg)
        assert owner == ex.pid
        assert handle_table.rewrite(reg, lambda text: change(text, ex)) == 1
        p = importer(tmp_path, kind, ex, guard_env(tmp_path, "0", 0, RANKGUARD_IPC="strict"), "deny", times=2)
        assert handle_table.records(reg) == [], "the untrusted slot was emptied"
    line = _say_once(p.stderr, "not trusted")
    assert expect_in_warning in line and "handles.table" in line, line
    assert all(r["verdict"] == "deny" and r["exporter_pid"] is None for r in r3_records(tmp_path))


@pytest.mark.parametrize("kind", ["mem", "event"])
def test_a_forged_handle_table_record_is_skipped(tmp_path, kind):
    """A slot whose record names another live process (pid 1) than the slot's owner."""
    _tamper_handle_table(tmp_path, kind,
                         lambda text, ex: text.replace(f"pid {ex.pid}\n".encode(), b"pid 1\n"), "forged")


@pytest.mark.parametrize("kind", ["mem", "event"])
def test_a_garbage_handle_table_record_is_skipped(tmp_path, kind):
    _tamper_handle_table(tmp_path, kind, lambda text, ex: b"\x00\xffnot a record\n" * 4, "corrupt")


def test_a_memory_record_does_not_answer_for_an_event_of_the_same_bytes(tmp_path):
    """The table keys a record by its handle's kind and bytes: a memory record rewritten to
    claim the key of an event with the same bytes is no event record, and the memory's
    own look-up finds it corrupt (its text names another key)."""
    _tamper_handle_table(tmp_path, "mem", lambda text, ex: text.replace(b"\nkey mem-", b"\nkey event-"),
                         "corrupt")


def test_an_untrusted_handle_table_leaves_event_records_to_files(tmp_path):
    """A handle table writable by others (or not this user's) is not used: the event's
    record is a file, as before the table, and the import finds it there."""
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    table = reg / "handles.table"
    table.write_bytes(b"")
    table.chmod(0o666)
    with exporter(tmp_path, "event", guard_env(tmp_path, "0", 0)) as ex:
        assert len([n for n in os.listdir(reg) if n.startswith("event-")]) == 1
        assert table.stat().st_size == 0, "the untrusted table was not written"
        p = importer(tmp_path, "event", ex, guard_env(tmp_path, "0", 0, RANKGUARD_IPC="strict"), "allow")
    assert "not trusted" not in p.stderr and r3_records(tmp_path) == []


def test_a_record_of_a_dead_exporter_is_not_trusted(tmp_path):
    """The exporter's record names a pid that has exited: provenance unknown, quietly."""
    reg = tmp_path / "registry"
    with exporter(tmp_path, "vmm", guard_env(tmp_path, "0", 0)) as ex:
        (rec,) = list(reg.iterdir())
        dead = subprocess.Popen(["true"])
        dead.wait()
        rec.write_text(rec.read_text().replace(f"pid {ex.pid}\n", f"pid {dead.pid}\n"))
        p = importer(tmp_path, "vmm", ex, guard_env(tmp_path, "1", 0), "allow")
    assert "not trusted" not in p.stderr
    assert not any(reg.iterdir()), "the stale record was removed"


def _in_mount_namespace(mount: str, tmp_path) -> list[str]:
    """A command line that runs `mount` in a private mount namespace, then execs the
    exporter in the same process (its pid stays the one Popen returned). Root needs only
    `unshare -m`; another user maps itself to root of a new user namespace (`-r`)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    flags = "-m" if os.geteuid() == 0 else "-rm"
    if run(["unshare", flags, "true"]).returncode != 0:
        pytest.skip(f"mount namespaces are not available here (unshare {flags} failed)")
    script = f'{mount} && exec "{PEER}" export mem "{tmp_path / "x"}"'
    return ["unshare", flags, "sh", "-c", script]


def _unwritable_export(tmp_path, cmd=None, preexec=None):
    """Export into a registry that cannot be written: the export succeeds, the guard says
    so once, leaves nothing behind, and importers see unknown provenance."""
    with exporter(tmp_path, "mem", guard_env(tmp_path, "0", 0), cmd=cmd, preexec=preexec) as ex:
        p = importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0), "allow")
        s = importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0, RANKGUARD_IPC="strict"), "deny")
    line = _say_once(ex.stderr, "not recorded")
    assert not list((tmp_path / "registry").iterdir()), "no record and no temporary left"
    assert "RANKGUARD WARN" not in p.stderr
    assert "RANKGUARD_IPC=strict" in s.stderr
    return line


def test_full_disk_is_said_once_and_never_crashes(tmp_path):
    # A tmpfs with no free inode: every file creation fails with ENOSPC.
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    cmd = _in_mount_namespace(f'mount -t tmpfs -o nr_inodes=1,size=64k,mode=0700 tmpfs "{reg}"', tmp_path)
    line = _unwritable_export(tmp_path, cmd=cmd)
    assert "No space left on device" in line


def test_read_only_registry_is_said_once_and_never_crashes(tmp_path):
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    if os.geteuid() != 0:
        reg.chmod(0o500)
        line = _unwritable_export(tmp_path)
        assert "Permission denied" in line
        return
    # root ignores permission bits: a read-only bind mount in a private mount namespace
    cmd = _in_mount_namespace(f'mount --bind -o ro "{reg}" "{reg}"', tmp_path)
    line = _unwritable_export(tmp_path, cmd=cmd)
    assert "Read-only file system" in line


# ------------------------------------------------------------------ concurrency

@pytest.mark.parametrize("ipc", ["default", "strict"])
def test_sixteen_processes_lose_no_record_and_see_none_torn(tmp_path, ipc):
    """16 processes of one rank, alternating GPU 0 and 1, export 4 handles each and import
    every other process's at the same time. Under default a lost record would let a
    cross-GPU import through; under strict it would deny a same-GPU one: either fails the
    program. A torn record would be said on stderr."""
    n, handles = 16, 4
    work = tmp_path / "storm"
    work.mkdir()
    procs = []
    for i in range(n):
        env = guard_env(tmp_path, str(i % 2), 0, RANKGUARD_IPC=ipc)
        procs.append(subprocess.Popen([str(PEER), "storm", str(i), str(n), "2", str(work), str(handles)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{out}\n{err}"
        assert "not trusted" not in err and "not recorded" not in err, err
        assert f"{(n // 2 - 1) * handles} imports allowed with intact bytes, {n // 2 * handles} denied" in out, out
    recs = r3_records(tmp_path)
    assert len(recs) == n * (n // 2) * handles
    assert all(r["exporter_pid"] is not None and r["exporter_gpu"] != r["gpu"] for r in recs)
    names = [f.name for f in (tmp_path / "registry").iterdir()]
    assert not [x for x in names if x.startswith(".tmp")], "no temporary left behind"


# ------------------------------------------------------------------ the default registry path

def test_a_squatted_default_registry_falls_back_to_a_private_working_one(tmp_path):
    """Issue 14, item 5: another user created the default registry directory first. The
    guard must not fall to "unknown provenance" (R3 silently off): every process of the user
    uses the same private fallback under the user's home, and R3 still works.

    Runs in a private mount namespace (a fresh /dev/shm, and the home's .cache on a fresh
    tmpfs), so the machine's real default registry is never touched."""
    import pwd
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, unshare(1) and nsenter(1) for a private mount namespace")
    if run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("mount namespaces are not available here (unshare -m failed)")
    home = pwd.getpwuid(os.geteuid()).pw_dir
    cache = os.path.join(home, ".cache")
    os.makedirs(cache, exist_ok=True)
    squat = f"/dev/shm/rankguard-{os.geteuid()}"
    setup = (f'mount --make-rprivate / && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && '
             f'mkdir -m 0777 {squat} && chown 65534:65534 {squat} && '
             f'mount -t tmpfs -o mode=0700 tmpfs "{cache}" && echo ready && exec sleep 300')
    holder = subprocess.Popen(["unshare", "-m", "sh", "-c", setup], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        enter = ["nsenter", "-t", str(holder.pid), "-m", "--"]
        env_x = guard_env(tmp_path, "0", 0, RANKGUARD_REGISTRY=None)
        with exporter(tmp_path, "mem", env_x, cmd=[*enter, PEER, "export", "mem", tmp_path / "x"]) as ex:
            p = run([*enter, PEER, "import", "mem", ex.dir, "deny"], env=guard_env(tmp_path, "1", 0, RANKGUARD_REGISTRY=None))
        assert p.returncode == 0, p.stdout + p.stderr
        assert "import-rc 800" in p.stdout, p.stdout + p.stderr
        (rec,) = r3_records(tmp_path)
        assert rec["verdict"] == "deny" and rec["exporter_pid"] == ex.pid
        line = _say_once(ex.stderr, "private fallback")
        assert squat in line and "owned by uid 65534" in line
        assert f"{cache}/rankguard/registry-" in line
    finally:
        holder.kill()
        holder.wait()


def test_an_exporter_of_4200_live_handles_is_still_recorded(tmp_path):
    """Issue 29, item 3: PyTorch's caching allocator exports one handle per segment, so one
    process reaches thousands of live exports. With a 4,096-record registry, exports past
    it were not recorded and a same-rank import of the last one on another GPU was allowed
    in enforce mode with no line at the importer. The registry holds 65,536 records: the
    4,200th export is recorded and its cross-GPU import denied."""
    env = guard_env(tmp_path, "0", 0)
    # Records in the handle table's slots, and files once their slots are taken.
    mems = lambda: len(handle_table.names(tmp_path / "registry", "mem-"))
    with exporter(tmp_path, "mem", env, cmd=[PEER, "many", "4200", tmp_path / "x"]) as ex:
        p = importer(tmp_path, "mem", ex, guard_env(tmp_path, "1", 0), "deny")
        assert mems() == 4200
    assert "import-rc 800" in p.stdout
    assert "full" not in ex.stderr + p.stderr, ex.stderr + p.stderr
    assert mems() == 0, "an exporter's records go at its exit (src/guard/7_decide/own_records.rs)"
    (rec,) = r3_records(tmp_path)
    assert rec["detail"].startswith("IPC import of memory exported on another GPU")


MAX_RECORDS = 65536  # crates/core/src/registry.rs


def test_an_export_lost_to_a_full_registry_makes_unknown_provenance_inside_a_rank_a_violation(tmp_path):
    """Issue 29, item 3: an export the registry could not record (full: 65,536 entries, here
    files that are not records, which no sweep removes) left its import with unknown
    provenance, allowed in enforce mode: the rank's own memory on another GPU went through.
    The exporter now writes the registry's overflow mark; while it names a live exporter, an
    import of unknown provenance by a process that knows its rank and GPU is refused in
    enforce mode and recorded in warn mode, with a line naming the capacity and the fix.
    Once every exporter the mark names has exited, unknown provenance is allowed again.
    (A VMM fd: its record is a file; a 64-byte handle's goes to the handle table, which the
    files do not fill.)"""
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700)
    for i in range(MAX_RECORDS):
        os.close(os.open(reg / f"filler-{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    with exporter(tmp_path, "vmm", guard_env(tmp_path, "0", 0)) as ex:
        p = importer(tmp_path, "vmm", ex, guard_env(tmp_path, "1", 0), "deny")
        w = importer(tmp_path, "vmm", ex, guard_env(tmp_path, "1", 0, RANKGUARD_MODE="warn"), "allow")
        mark = (reg / "overflow").read_text()
    assert f"exporter {ex.pid} " in mark, mark
    assert "import-rc 800" in p.stdout
    _say_once(ex.stderr, "overflow mark")
    said = _say_once(p.stderr, "could not record its exports")
    assert f"pid {ex.pid}" in said and str(MAX_RECORDS) in said and "RANKGUARD_REGISTRY" in said, said
    deny, warn = r3_records(tmp_path)
    assert deny["verdict"] == "deny" and deny["exporter_pid"] is None
    assert deny["detail"].startswith("IPC import of unknown provenance inside a rank"), deny["detail"]
    assert str(MAX_RECORDS) in deny["detail"] and "fix:" in deny["detail"]
    assert warn["verdict"] == "warn" and warn["mode"] == "warn"
    # The exporter has exited: its handles died with it, and the mark with them.
    with exporter(tmp_path, "vmm", guard_env(tmp_path, "0", 0, LD_PRELOAD=None)) as ex2:
        q = importer(tmp_path, "vmm", ex2, guard_env(tmp_path, "1", 0), "allow")
    assert "RANKGUARD WARN" not in q.stderr and len(r3_records(tmp_path)) == 2
    assert not (reg / "overflow").exists()
    shutil.rmtree(reg)


def test_a_squatted_default_registry_of_a_user_without_a_home_refuses_unknown_imports(tmp_path):
    """Issue 29, item 4: a user whose home does not exist (a service account, a container's
    HOME=/nonexistent) has no private fallback. Another user who creates the default
    registry directory first must not switch R3 off: with no registry the user can trust,
    an import of unknown provenance is refused in enforce mode and recorded in warn mode,
    and the guard says so once with the fix (RANKGUARD_REGISTRY).

    Two throw-away users (a squatter and the homeless user) are created and removed; the
    pair runs in a private mount namespace on a fresh /dev/shm, so the machine's real
    default registries are never touched."""
    import pwd
    import tempfile
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "nsenter", "setpriv", "useradd", "userdel")):
        pytest.skip("needs root, unshare(1), nsenter(1), setpriv(1) and useradd(8)")
    if run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("mount namespaces are not available here (unshare -m failed)")
    tag = f"{os.getpid() % 100000}"
    squatter, homeless = f"rgsquat{tag}", f"rghome{tag}"
    made, holder, work = [], None, None
    try:
        for name, home in ((squatter, f"/nonexistent-{squatter}"), (homeless, "/nonexistent")):
            p = run(["useradd", "-M", "-N", "-d", home, "-s", "/bin/false", name])
            assert p.returncode == 0, p.stderr
            made.append(name)
        hu, su = pwd.getpwnam(homeless), pwd.getpwnam(squatter)
        assert not os.path.exists(hu.pw_dir)
        squat = f"/dev/shm/rankguard-{hu.pw_uid}"
        as_squatter = f"setpriv --reuid {su.pw_uid} --regid {su.pw_gid} --clear-groups"
        setup = (f'mount --make-rprivate / && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && '
                 f'{as_squatter} mkdir -m 0777 {squat} && echo ready && exec sleep 300')
        holder = subprocess.Popen(["unshare", "-m", "sh", "-c", setup], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
        # The exchange's files (handles, audit) in a directory the homeless user owns.
        work = pathlib.Path(tempfile.mkdtemp(prefix="rg-homeless-"))
        (work / "x").mkdir()
        for d in (work, work / "x"):
            os.chown(d, hu.pw_uid, hu.pw_gid)
        # The programs the homeless user runs, copied where that user can reach them: the
        # checkout may lie below a directory only its owner can enter (a `mktemp -d` clone).
        built = work / "built"
        shutil.copytree(FAKE, built / "fake", symlinks=True)
        shutil.copy2(GUARD, built / GUARD.name)
        shutil.copy2(PEER, built / PEER.name)
        for d in (built, built / "fake"):
            d.chmod(0o755)
        peer = built / PEER.name
        as_homeless = ["nsenter", "-t", str(holder.pid), "-m", "--",
                       "setpriv", "--reuid", str(hu.pw_uid), "--regid", str(hu.pw_gid), "--clear-groups"]

        def env(cvd, **extra):
            return guard_env(work, cvd, 0, RANKGUARD_REGISTRY=None, HOME="/nonexistent",
                             LD_PRELOAD=str(built / GUARD.name), LD_LIBRARY_PATH=str(built / "fake"),
                             **extra)

        with exporter(work, "mem", env("0"), cmd=[*as_homeless, peer, "export", "mem", work / "x"]) as ex:
            deny = run([*as_homeless, peer, "import", "mem", ex.dir, "deny"], env=env("1"))
            warn = run([*as_homeless, peer, "import", "mem", ex.dir, "allow"], env=env("1", RANKGUARD_MODE="warn"))
        # Today's behaviour before the fix: unknown provenance, allowed (import-rc 0).
        assert deny.returncode == 0 and "import-rc 800" in deny.stdout, deny.stdout + deny.stderr
        assert warn.returncode == 0 and "import-rc 0" in warn.stdout, warn.stdout + warn.stderr
        for p in (ex, deny, warn):
            line = _say_once(p.stderr, "no registry this user can trust")
            assert squat in line and f"owned by uid {su.pw_uid}" in line, line
            assert "/nonexistent/.cache/rankguard/registry-" in line, line
            assert "refused" in line and "Fix: set RANKGUARD_REGISTRY" in line, line
        denial = [l for l in deny.stderr.splitlines() if "denied" in l]
        assert len(denial) == 1 and "R3" in denial[0] and "unknown provenance: refused" in denial[0], deny.stderr
        recs = r3_records(work)
        assert [r["verdict"] for r in recs] == ["deny", "warn"], recs
        for r in recs:
            assert r["detail"].startswith("IPC import of unknown provenance: refused"), r
            assert r["exporter_pid"] is None and r["gpu"] == gpu_uuid(1)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        for name in made:
            run(["userdel", name])
