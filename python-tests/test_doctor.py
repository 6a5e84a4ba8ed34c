"""`rankguard doctor` (issue 32): beyond `check`, whether the guard loads and acts in a
child here, whether the audit path can be written, whether the registry is trusted and how
full, which build `rankguard lib` picks and why; on a healthy and on broken set-ups, as
text and as `--json` (validated against docs/schema/doctor.v1.json)."""
from __future__ import annotations

import json
import os

import _handle_table as handle_table
from conftest import CLI, LIB_GUARD, clean_env, run
from test_schema import valid, validator


def doctor(**env):
    p = run([CLI, "doctor"], env=clean_env(FAKECUDA_GPUS="8", **env), timeout=120)
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines() if ln and not ln.startswith("doctor:")}
    return p, lines


def healthy(tmp_path, **extra):
    reg = tmp_path / "registry"
    reg.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "audit").mkdir(exist_ok=True)
    env = dict(RANKGUARD_REGISTRY=str(reg), RANKGUARD_AUDIT=str(tmp_path / "audit" / "%h.%p.jsonl"))
    env.update(extra)
    return env


def test_a_healthy_setup(tmp_path):
    p, lines = doctor(**healthy(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    glibc = ".".join(os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    assert lines["library"].startswith(f"library    ok: {LIB_GUARD.resolve()} ("), p.stdout
    assert f"this glibc is {glibc}" in lines["library"], p.stdout
    assert str(LIB_GUARD.resolve()) in lines["library"] and "found beside the rankguard executable" in lines["library"]
    # The child under the guard was seen acting: its planted R2 said and recorded.
    assert lines["guard"].startswith("guard      ok: a child under the guard"), p.stdout
    assert "cuDeviceGet(ordinal=1) said as R2 and recorded in its audit file" in lines["guard"], p.stdout
    assert lines["audit"] == f"audit      ok: RANKGUARD_AUDIT={tmp_path}/audit/%h.%p.jsonl: {tmp_path}/audit is writable"
    assert lines["registry"] == (f"registry   ok: RANKGUARD_REGISTRY {tmp_path}/registry: yours, mode 0700; "
                                 "0 of 65536 entries (0% full)"), p.stdout
    assert p.stdout.rstrip().endswith("doctor: ok, the guard works here"), p.stdout
    # The probe leaves nothing behind in the user's audit directory or registry.
    assert list((tmp_path / "audit").iterdir()) == []


def test_a_broken_setup_names_each_problem_and_its_fix(tmp_path):
    """No guard build, an audit directory that does not exist, a squatted registry (another
    user's directory): each is a problem (status 1), said with its fix."""
    squat = tmp_path / "squat"
    squat.mkdir(mode=0o700)
    os.chown(squat, 65534, 65534)      # the suite runs as root (scripts/setup needs it)
    p, lines = doctor(RANKGUARD_LIB=str(tmp_path / "no-such-librankguard.so"),
                      RANKGUARD_AUDIT=str(tmp_path / "missing" / "%h.%p.jsonl"),
                      RANKGUARD_REGISTRY=str(squat))
    assert p.returncode == 1, p.stdout + p.stderr
    assert lines["library"].startswith("library    PROBLEM: no guard build: RANKGUARD_LIB="), p.stdout
    assert lines["guard"].startswith("guard      PROBLEM: not run"), p.stdout
    assert (f"its directory {tmp_path}/missing does not exist; create it (mkdir -p {tmp_path}/missing)"
            in lines["audit"]) and "PROBLEM" in lines["audit"], p.stdout
    assert "PROBLEM" in lines["registry"] and "is owned by uid 65534, not by this user" in lines["registry"], p.stdout
    assert "point RANKGUARD_REGISTRY at a directory you own with mode 0700" in lines["registry"], p.stdout
    assert p.stdout.rstrip().endswith("doctor: 4 problems found; the guard does not work here as documented"), p.stdout


def test_an_unwritable_audit_path(tmp_path):
    """A directory part that is a file, and one on a read-only file system (/proc: root's
    permissions do not help there)."""
    f = tmp_path / "file"
    f.write_text("")
    for template, why in ((f"{f}/%p.jsonl", "is not a directory"), ("/proc/self/%p.jsonl", "is not writable")):
        p, lines = doctor(**healthy(tmp_path, RANKGUARD_AUDIT=template))
        assert p.returncode == 1, p.stdout
        assert lines["audit"].startswith("audit      PROBLEM: ") and why in lines["audit"], p.stdout


def test_a_guard_that_does_not_load_in_a_child(tmp_path):
    """RANKGUARD_LIB names a file that is no library: `lib` hands it out, but the loader
    refuses it in the child; doctor says so (check cannot tell)."""
    fake = tmp_path / "librankguard.so"
    fake.write_text("not an ELF file\n")
    p, lines = doctor(**healthy(tmp_path, RANKGUARD_LIB=str(fake)))
    assert p.returncode == 1, p.stdout
    assert lines["library"].startswith(f"library    ok: {fake} (RANKGUARD_LIB names it"), p.stdout
    assert lines["guard"].startswith("guard      PROBLEM: the guard was in the child's LD_PRELOAD but is not "
                                     "loaded in it"), p.stdout


def test_without_a_driver_the_guard_loads_but_cannot_be_seen_acting(tmp_path):
    env = healthy(tmp_path)
    e = clean_env(**env)
    e.pop("LD_LIBRARY_PATH")
    p = run([CLI, "doctor"], env=e, timeout=120)
    assert p.returncode == 0, p.stdout
    guard = next(ln for ln in p.stdout.splitlines() if ln.startswith("guard "))
    assert guard.startswith("guard      warning: the guard loads in a child, but it could not be seen acting: "
                            "no CUDA driver here"), p.stdout


def doctor_json(**env):
    p = run([CLI, "doctor", "--json"], env=clean_env(FAKECUDA_GPUS="8", **env), timeout=120)
    return p, json.loads(p.stdout)


def test_json_on_a_healthy_setup_matches_its_schema_and_the_text(tmp_path):
    env = healthy(tmp_path)
    p, d = doctor_json(**env)
    assert p.returncode == 0, p.stdout + p.stderr
    valid("doctor.v1.json", d)
    assert (d["format"], d["version"]) == ("rankguard-doctor", 1) and list(d)[:2] == ["format", "version"]
    assert d["ok"] is True and d["problems"] == 0 and d["warnings"] == 0
    assert d["summary"] == "doctor: ok, the guard works here"
    c = d["checks"]
    assert list(c) == ["library", "guard", "audit", "registry", "check"]
    assert [c[k]["status"] for k in c] == ["ok", "ok", "ok", "ok", "info"], c
    assert c["library"]["path"] == str(LIB_GUARD.resolve()) and "beside the rankguard executable" in c["library"]["why"]
    assert c["audit"] == {"status": "ok", "message": f"RANKGUARD_AUDIT={tmp_path}/audit/%h.%p.jsonl: "
                          f"{tmp_path}/audit is writable", "template": f"{tmp_path}/audit/%h.%p.jsonl",
                          "directory": f"{tmp_path}/audit"}
    assert c["registry"] == {"status": "ok", "message": f"RANKGUARD_REGISTRY {tmp_path}/registry: yours, mode 0700; "
                             "0 of 65536 entries (0% full)", "directory": f"{tmp_path}/registry",
                             "configured": True, "entries": 0, "capacity": 65536,
                             "handle_table_used": None, "handle_table_slots": 4096}
    # The same checks as the text form, the same words: each line is NAME STATUS: MESSAGE.
    t, lines = doctor(**env)
    for k, v in c.items():
        word = {"ok": "ok: ", "warning": "warning: ", "problem": "PROBLEM: ", "info": ""}[v["status"]]
        assert lines[k] == f"{k:<10} {word}{v['message']}", (lines[k], v)
    assert t.stdout.rstrip().endswith(d["summary"])


def test_json_on_a_broken_setup_names_the_same_problems_and_exits_1(tmp_path):
    """No guard build, an unwritable audit path (a file as its directory), a squatted
    registry: status 1, as the text form."""
    squat = tmp_path / "squat"
    squat.mkdir(mode=0o700)
    os.chown(squat, 65534, 65534)
    f = tmp_path / "file"
    f.write_text("")
    env = dict(RANKGUARD_LIB=str(tmp_path / "no-such-librankguard.so"), RANKGUARD_AUDIT=f"{f}/%p.jsonl",
               RANKGUARD_REGISTRY=str(squat))
    p, d = doctor_json(**env)
    assert p.returncode == 1, p.stdout + p.stderr
    valid("doctor.v1.json", d)
    assert d["ok"] is False and d["problems"] == 4, d
    assert d["summary"] == "doctor: 4 problems found; the guard does not work here as documented"
    c = d["checks"]
    assert [c[k]["status"] for k in ("library", "guard", "audit", "registry")] == ["problem"] * 4, c
    assert c["library"]["path"] is None and c["library"]["message"].startswith("no guard build: RANKGUARD_LIB=")
    assert c["guard"]["message"].startswith("not run")
    assert c["audit"]["template"] == f"{f}/%p.jsonl" and c["audit"]["directory"] is None
    assert "is not a directory" in c["audit"]["message"], c["audit"]
    assert c["registry"]["entries"] is None and c["registry"]["configured"] is True
    assert "is owned by uid 65534, not by this user" in c["registry"]["message"], c["registry"]
    t = run([CLI, "doctor"], env=clean_env(FAKECUDA_GPUS="8", **env), timeout=120)
    assert t.returncode == p.returncode


def test_json_without_an_audit_variable_is_a_warning_with_nulls(tmp_path):
    env = healthy(tmp_path)
    del env["RANKGUARD_AUDIT"]
    p, d = doctor_json(**env)
    assert p.returncode == 0, p.stdout
    valid("doctor.v1.json", d)
    assert d["ok"] is True and d["warnings"] == 1
    assert d["checks"]["audit"]["status"] == "warning"
    assert d["checks"]["audit"]["template"] is None and d["checks"]["audit"]["directory"] is None


def test_the_schema_refuses_what_doctor_never_prints(tmp_path):
    _, d = doctor_json(**healthy(tmp_path))
    v = validator("doctor.v1.json")
    assert v.is_valid(d)
    assert not v.is_valid({**d, "version": 2})
    assert not v.is_valid({**d, "checks": {k: x for k, x in d["checks"].items() if k != "audit"}})
    assert not v.is_valid({**d, "checks": {**d["checks"], "guard": {"status": "fine", "message": ""}}})


def test_the_registry_line_counts_the_handle_tables_slots(tmp_path):
    """The records of exported memory handles and events are slots of the registry's handle
    table (crates/core/src/handle_table.rs): doctor says how many are taken, warns when it
    is nearly full (records then go to files, slower shares), and warns of a table the guard
    would not use (writable by others), as the guard checks it."""
    env = healthy(tmp_path)
    table = tmp_path / "registry" / handle_table.FILE_NAME
    handle_table.create(tmp_path / "registry", full=[3, 70, 4000])
    p, lines = doctor(**env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines["registry"] == (f"registry   ok: RANKGUARD_REGISTRY {tmp_path}/registry: yours, mode 0700; "
                                 "1 of 65536 entries (0% full); handle table 3 of 4096 slots"), p.stdout
    handle_table.create(tmp_path / "registry", full=range(3700))
    p, lines = doctor(**env)
    assert lines["registry"].startswith("registry   warning: ") and "handle table 3700 of 4096 slots" in lines["registry"]
    assert "nearly full: a record that finds no slot is written as a file" in lines["registry"], p.stdout
    table.chmod(0o666)
    p, d = doctor_json(**env)
    valid("doctor.v1.json", d)
    c = d["checks"]["registry"]
    assert c["status"] == "warning" and c["handle_table_used"] is None, c
    assert "handles.table is not used (owned by uid" in c["message"] and "with mode 0666)" in c["message"], c
