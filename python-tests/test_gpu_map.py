"""Issue 32, the guard's side: R1's "started with" rule, the GPU map record, and the
guard's lines.

- A process started with a single-entry CUDA_VISIBLE_DEVICES that re-points itself to
  another GPU before its first cuInit is R1 (enforce: 78; warn: one R1 record), under plain
  LD_PRELOAD, from Python (NVIDIA's cuda.bindings) as from C; one started with several
  entries (or none) that narrows itself to one keeps running (docs/design.md §1).
- Every guarded process writes one map record at its first cuInit (docs/report.md, "The
  map record"), so a clean process leaves a non-empty audit file; RANKGUARD_DEBUG=INFO says
  it as a sentence.
- torchrun's shared run id `none` is no job id, said once.
"""
from __future__ import annotations

import json
import pathlib
import re

import jsonschema
import pytest

from conftest import PYTHON, ROOT
from _guard import guarded, prog

GPU2 = "GPU-12c0ffee-0000-4000-8000-000000000002"
GPU5 = "GPU-15c0ffee-0000-4000-8000-000000000005"
FAKENVML = ROOT / "c-tests" / "build" / "fakenvml"

# The most common legacy line: the script picks its GPU itself before CUDA is imported.
REWRITE = """
import os, sys
{set}
from cuda.bindings import driver as d
err = int(d.cuInit(0)[0])
print("cuInit=%d" % err, "cuDeviceGet=%d" % int(d.cuDeviceGet(0)[0]), flush=True)
"""


def script(tmp_path: pathlib.Path, value: str | None) -> pathlib.Path:
    line = ('os.environ.pop("CUDA_VISIBLE_DEVICES", None)' if value is None
            else f'os.environ["CUDA_VISIBLE_DEVICES"] = "{value}"')
    p = tmp_path / "rewrite.py"
    p.write_text(REWRITE.format(set=line))
    return p


def python_cmd(tmp_path, value):
    return [PYTHON, script(tmp_path, value)]


def c_cmd(tmp_path, value):
    return [prog("guard_repoint"), "-" if value is None else value]


CMDS = {"python": python_cmd, "c": c_cmd}


@pytest.mark.parametrize("lang", CMDS)
def test_a_process_started_with_one_gpu_that_repoints_itself_is_stopped(tmp_path, lang):
    r = guarded(CMDS[lang](tmp_path, "5"), tmp_path, cvd="2", mode="enforce")
    assert r.rc == 78, r.out + r.err
    assert "cuInit=" not in r.out, r.out
    r1 = [x for x in r.audit if x["rule"] == "R1"]
    assert len(r1) == 1 and r1[0]["verdict"] == "deny", r.audit
    assert r1[0]["detail"] == ("the process was started with one GPU and re-pointed "
                               "CUDA_VISIBLE_DEVICES to another before its first cuInit")
    assert (r1[0]["cvd"], r1[0]["rank_gpu"], r1[0]["gpu"]) == ("5", "2", GPU5)
    line = next(l for l in r.err.splitlines() if " cuInit(" in l)
    assert " RANKGUARD DENY cuInit(flags=0) denied [R1 one GPU per rank]: the process was started" in line
    assert f"CUDA_VISIBLE_DEVICES=5, rank GPU 2; this process sees {GPU5}; at " in line
    assert "RANKGUARD DENY terminating: this process breaks rule R1" in r.err
    [m] = r.maps
    assert (m["cvd_start"], m["cvd"], m["gpu"], m["rank_gpu"], m["r1"]) == ("2", "5", GPU5, "2", "deny")


@pytest.mark.parametrize("lang", CMDS)
def test_in_warn_mode_the_repointed_process_runs_with_one_r1_record(tmp_path, lang):
    r = guarded(CMDS[lang](tmp_path, "5"), tmp_path, cvd="2", mode="warn")
    assert r.rc == 0, r.out + r.err
    assert "cuInit=0" in r.out, r.out
    r1 = [x for x in r.audit if x["rule"] == "R1"]
    assert len(r1) == 1 and r1[0]["verdict"] == "warn", r.audit
    assert r1[0]["detail"].startswith("the process was started with one GPU and re-pointed")
    assert " RANKGUARD WARN cuInit(flags=0) allowed (warn mode) [R1 " in r.err
    assert " RANKGUARD DENY " not in r.err
    assert [m["r1"] for m in r.maps] == ["warn"]


@pytest.mark.parametrize("lang", CMDS)
@pytest.mark.parametrize("start", ["1,2,5", None])
def test_a_process_that_narrows_itself_from_several_entries_or_none_runs(tmp_path, lang, start):
    """The single-rank case: given several GPUs (or all), the program picks one itself."""
    r = guarded(CMDS[lang](tmp_path, "5"), tmp_path, cvd=start, mode="enforce")
    assert r.rc == 0, r.out + r.err
    assert "cuInit=0" in r.out, r.out
    assert r.audit == [] and "RANKGUARD" not in r.err, r.err
    [m] = r.maps
    assert (m["cvd_start"], m["cvd"], m["gpu"], m["rank_gpu"], m["r1"]) == (start, "5", GPU5, None, "ok")


@pytest.mark.parametrize("lang", CMDS)
def test_keeping_or_dropping_the_gpu_it_was_started_with(tmp_path, lang):
    # the same entry again: kept
    r = guarded(CMDS[lang](tmp_path, "2"), tmp_path, cvd="2")
    assert (r.rc, r.audit) == (0, []), r.err
    # the full UUID of another GPU: R1 (a full UUID is compared by identity)
    r = guarded(CMDS[lang](tmp_path, GPU5), tmp_path, cvd=GPU2)
    assert r.rc == 78, r.out + r.err
    assert [x["detail"] for x in r.audit][0].startswith("the process was started with one GPU")
    # deliberately no GPU after starting with one: not a rank process, the driver's answer
    r = guarded(CMDS[lang](tmp_path, ""), tmp_path, cvd="2")
    assert (r.rc, r.audit) == (0, []), r.err


def test_a_clean_process_leaves_its_map_record(tmp_path):
    r = guarded([prog("guard_init")], tmp_path, cvd="3", mode="enforce", RANK="4",
                LOCAL_RANK="1", RANKGUARD_RANK_GPU="3")
    assert r.rc == 0 and r.audit == [], r.err
    [m] = r.maps
    schema = json.loads((ROOT / "docs" / "schema" / "audit-record.v1.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(m)
    assert list(m) == ["format", "version", "kind", "ts", "host", "pid", "start", "rank",
                       "local_rank", "job", "rank_root", "mode", "cvd", "cvd_start", "devices",
                       "gpu", "rank_gpu", "rank_gpu_uuid", "r1"]
    assert (m["format"], m["version"], m["kind"]) == ("rankguard-audit", 1, "map")
    assert (m["rank"], m["local_rank"], m["rank_root"], m["mode"]) == (4, 1, None, "enforce")
    assert (m["cvd"], m["cvd_start"], m["devices"], m["rank_gpu"], m["r1"]) == ("3", "3", 1, "3", "ok")
    assert m["gpu"] == "GPU-13c0ffee-0000-4000-8000-000000000003"
    assert isinstance(m["pid"], int) and isinstance(m["start"], int) and isinstance(m["ts"], float)


def test_without_a_rank_variable_the_map_names_the_rank_root(tmp_path):
    r = guarded([prog("guard_init")], tmp_path, cvd="3")
    [m] = r.maps
    assert m["rank"] is None and m["rank_root"]["pid"] == m["pid"], m
    assert m["rank_root"]["start"] == m["start"]


def test_off_mode_and_processes_without_cuda_write_no_map(tmp_path):
    assert guarded([prog("guard_init")], tmp_path, cvd="3", mode="off").maps == []
    r = guarded(["/bin/true"], tmp_path, cvd="3")
    assert (r.maps, r.audit) == ([], [])


def test_info_says_the_map_line_and_debug_speaks_in_sentences(tmp_path):
    r = guarded([prog("guard_init")], tmp_path, cvd="3", RANKGUARD_DEBUG="INFO")
    info = [l for l in r.err.splitlines() if " RANKGUARD INFO " in l]
    pid = r.maps[0]["pid"]
    assert [l.split(" RANKGUARD INFO ", 1)[1] for l in info] == [
        f"GPU map: pid {pid} (its own rank root) sees GPU-13c0ffee-0000-4000-8000-000000000003 "
        "(1 device; CUDA_VISIBLE_DEVICES=3, started with 3); R1 kept"], r.err
    r = guarded([prog("guard_init")], tmp_path, cvd="3", RANKGUARD_DEBUG="DEBUG")
    debug = [l.split(" RANKGUARD DEBUG ", 1)[1] for l in r.err.splitlines() if " RANKGUARD DEBUG " in l]
    assert ("R1 check at cuInit: CUDA_VISIBLE_DEVICES is 3 (1 entry CUDA reads), the driver "
            "enumerates 1 device, GPU-13c0ffee-0000-4000-8000-000000000003; no rank GPU is named; "
            "it is the GPU the process was started with") in debug, debug
    assert any(l.startswith("rank root: no guarded ancestor") for l in debug), debug
    # sentences, not Rust's Debug form of a struct
    assert not [l for l in debug if re.search(r"[A-Z]\w+ \{|Some\(|None\b", l)], debug


def test_lines_say_unset_as_unset_and_a_missing_gpu_with_the_node_range(tmp_path):
    r = guarded([prog("guard_init")], tmp_path, cvd=None)
    assert r.rc == 78
    assert ("[R1 one GPU per rank]: CUDA_VISIBLE_DEVICES is unset, so the process sees every GPU "
            "of the node (8 devices); CUDA_VISIBLE_DEVICES=<unset>,") in r.err, r.err
    assert "0 CUDA_VISIBLE_DEVICES entries" not in r.err
    # GPU 9 on a node of GPUs 0-7 (NVML, which ignores CVD, counts the node's GPUs)
    r = guarded([prog("guard_init")], tmp_path, cvd="9",
                LD_LIBRARY_PATH=f"{ROOT / 'c-tests' / 'build' / 'fakecuda'}:{FAKENVML}")
    assert r.rc == 78
    assert ("[R1 one GPU per rank]: CUDA_VISIBLE_DEVICES names a GPU that does not exist: this node "
            "has GPUs 0-7; CUDA_VISIBLE_DEVICES=9,") in r.err, r.err
    # without NVML the guard says what it knows
    r = guarded([prog("guard_init")], tmp_path, cvd="9")
    assert ("CUDA_VISIBLE_DEVICES names a GPU the driver does not have (it enumerates no device)"
            in r.err), r.err


def test_a_denial_is_tagged_deny_and_the_site_comes_before_the_fix(tmp_path):
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="3", mode="enforce")
    assert r.value("rc") == 101
    [line] = [l for l in r.err.splitlines() if "cuDeviceGet(" in l]
    assert re.search(r" RANKGUARD DENY cuDeviceGet\(.*\) denied \[R2 cuda:0 only\]: .*; at \S+; fix: use device 0", line), line
    w = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="3", mode="warn")
    assert " RANKGUARD WARN cuDeviceGet(" in w.err and " RANKGUARD DENY " not in w.err, w.err


def test_a_missing_audit_directory_is_said_once_with_the_fix(tmp_path):
    from conftest import GUARD, clean_env, run
    missing = tmp_path / "no" / "such"
    env = clean_env(CUDA_VISIBLE_DEVICES="3", LD_PRELOAD=str(GUARD),
                    RANKGUARD_AUDIT=str(missing / "audit.%p.jsonl"))
    p = run([prog("guard_call"), "link", "cuDeviceGet", "1"], env=env)
    said = [l for l in p.stderr.splitlines() if "RANKGUARD_AUDIT=" in l]
    assert len(said) == 1, p.stderr
    assert f"its directory {missing} does not exist; fix: create it before the job starts (mkdir -p {missing})" in said[0]


@pytest.mark.parametrize("extra,job", [({}, None), ({"SLURM_JOB_ID": "41"}, "slurm:41.-")])
def test_torchrun_run_id_none_is_no_job_id_said_once(tmp_path, extra, job):
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="3", mode="warn",
                RANK="0", TORCHELASTIC_RUN_ID="none", **extra)
    [m] = r.maps
    assert m["job"] == job and r.audit[0]["job"] == job, (m, r.audit)
    said = [l for l in r.err.splitlines() if "TORCHELASTIC_RUN_ID=none" in l]
    assert len(said) == 1, r.err
    assert "is not used as the job id" in said[0] and "--rdzv-id" in said[0]
    # a run id of its own is the job, and nothing is said
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="3", mode="warn",
                RANK="0", TORCHELASTIC_RUN_ID="job-7")
    assert r.maps[0]["job"] == "torchelastic:job-7" and "TORCHELASTIC_RUN_ID" not in r.err


def test_launch_prefix_output_names_the_rank_of_a_guard_line_once(tmp_path):
    from conftest import CLI, clean_env, run
    p = run([CLI, "launch", "--nproc-per-node", "2", "--prefix-output", "--",
             prog("guard_call"), "link", "cuDeviceGet", "1"],
            env=clean_env(FAKECUDA_GPUS="8"), timeout=120)
    said = [l for l in p.stderr.splitlines() if "RANKGUARD DENY cuDeviceGet(" in l]
    assert len(said) == 2, p.stderr
    for line in said:
        assert re.match(r"^\[rank (\d)\] \S+:\d+:\d+ RANKGUARD DENY cuDeviceGet\(", line), line
        assert line.count("[rank ") == 1, line
