"""The debug log (RANKGUARD_DEBUG, RANKGUARD_DEBUG_FILE): the guard's own writer since
tracing left the preload (src/guard/3_output/debug_log.rs). Lines have the shape of the guard's
stderr lines and NCCL_DEBUG's (`host:pid:tid [rank ...] RANKGUARD LEVEL message`), the
level filters them, and a repeated warning goes to the log whole."""
from __future__ import annotations

import re

from _guard import guarded, prog


def log_lines(tmp_path, cmd, cvd, level, mode="enforce"):
    r = guarded(cmd, tmp_path, cvd=cvd, mode=mode, RANKGUARD_DEBUG=level,
                RANKGUARD_DEBUG_FILE=str(tmp_path / "dbg-%p.log"))
    files = list(tmp_path.glob("dbg-*.log"))
    assert len(files) == 1, (files, r.err)
    pid = files[0].name[len("dbg-"):-len(".log")]
    text = files[0].read_text()
    assert text == "" or text.endswith("\n"), text
    lines = text.splitlines()
    for line in lines:
        assert re.match(rf"^[^\s:]+:{pid}:\d+ \[rank [^\]]+\] RANKGUARD (DENY|WARN|INFO|DEBUG|TRACE) \S",
                        line), line
    files[0].unlink()
    return r, lines


def test_debug_lines_name_the_process_and_the_level(tmp_path):
    r, lines = log_lines(tmp_path, [prog("guard_call"), "dlsym", "cuDeviceGet", "0"], "0", "DEBUG")
    assert r.value("rc") == 0, r.err
    r1 = [l for l in lines if " RANKGUARD DEBUG R1 check at cuInit: " in l]
    assert len(r1) == 1, lines
    # a sentence, not a Rust struct (issue 32)
    assert r1[0].endswith(" RANKGUARD DEBUG R1 check at cuInit: CUDA_VISIBLE_DEVICES is 0 (1 entry CUDA "
                          "reads), the driver enumerates 1 device, GPU-10c0ffee-0000-4000-8000-000000000000; "
                          "no rank GPU is named; it is the GPU the process was started with"), r1
    assert not [l for l in lines if "{" in l or "Some(" in l], lines
    # TRACE lines are below DEBUG: not written.
    assert not [l for l in lines if " RANKGUARD TRACE " in l], lines
    # Nothing of the log reaches stderr when it has a file.
    assert "RANKGUARD DEBUG" not in r.err, r.err


def test_trace_adds_the_dlsym_hand_outs_and_info_says_only_the_map(tmp_path):
    _, lines = log_lines(tmp_path, [prog("guard_call"), "dlsym", "cuDeviceGet", "0"], "0", "TRACE")
    assert any(l.endswith(" RANKGUARD TRACE dlsym: handing out the guard's wrapper symbol=cuDeviceGet")
               for l in lines), lines
    _, lines = log_lines(tmp_path, [prog("guard_call"), "dlsym", "cuDeviceGet", "0"], "0", "INFO")
    # INFO: the process's GPU map line (its map record, docs/report.md), nothing of DEBUG
    assert [l.split(" RANKGUARD ", 1)[1] for l in lines] == [
        f"INFO GPU map: pid {lines[0].split(':')[1]} (its own rank root) sees "
        "GPU-10c0ffee-0000-4000-8000-000000000000 (1 device; CUDA_VISIBLE_DEVICES=0, started with 0); "
        "R1 kept"], lines


def test_repeated_warnings_go_to_the_log_whole(tmp_path):
    """Four threads break R2 once each in warn mode: the first says it on stderr, the other
    three are in the log at WARN, as the same whole line."""
    r, lines = log_lines(tmp_path, [prog("guard_race"), "4"], "3", "WARN", mode="warn")
    assert "ok 4" in r.out, r.out + r.err
    said = [l for l in r.err.splitlines() if "RANKGUARD WARN cuDeviceGet(ordinal=1)" in l]
    assert len(said) == 1, r.err
    logged = [l for l in lines if "RANKGUARD WARN cuDeviceGet(ordinal=1) allowed (warn mode) [R2" in l]
    assert len(logged) == 3, lines
    assert all(l.split(" RANKGUARD ", 1)[1] == said[0].split(" RANKGUARD ", 1)[1] for l in logged), lines
    # WARN is the least verbose level: no DEBUG lines.
    assert not [l for l in lines if " RANKGUARD DEBUG " in l], lines


def test_without_the_variable_there_is_no_log(tmp_path):
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "0"], tmp_path, cvd="0",
                RANKGUARD_DEBUG_FILE=str(tmp_path / "dbg-%p.log"))
    assert r.value("rc") == 0, r.err
    assert list(tmp_path.glob("dbg-*")) == []
    assert "RANKGUARD" not in r.err, r.err
