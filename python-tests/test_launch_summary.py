"""`rankguard launch` ends with a summary (issue 32): how each rank ended, the guard's
records of this job per rule and rank, and where the audit is; enforce-mode denials do not
change the job's status (docs/cli.md, "The summary"); a RANKGUARD_AUDIT no rank could write
is refused before any rank starts, said once with the fix."""
from __future__ import annotations

from _cli import child_cmd, cli, clean_env
from _guard import prog


def launch(*args, **env):
    return cli("launch", *args, env=clean_env(FAKECUDA_GPUS="8", **env), timeout=120)


def summary_of(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("rankguard launch: summary: "))
    return lines[i:]


def test_a_job_with_denials_ends_with_them_per_rule_and_rank(tmp_path):
    """Eight R2 denials in enforce mode (the issue's job): status 0, as the ranks', and a
    summary naming them and the audit."""
    audit = tmp_path / "audit"
    audit.mkdir()
    p = launch("--nproc-per-node", "8", "--", prog("guard_call"), "link", "cuDeviceGet", "1",
               RANKGUARD_AUDIT=f"{audit}/%h.%p.jsonl")
    assert p.returncode == 0, p.stderr
    assert summary_of(p.stderr) == [
        "rankguard launch: summary: ranks 0-7 exited 0; status 0",
        "  the guard recorded 8 violations in this job: 8 denied",
        "  R2 cuda:0 only: 8 denied in ranks 0-7 (cuDeviceGet x8)",
        "  denials do not change the job's status: each denied call returned a CUDA error to the program, "
        "which went on; `rankguard report` exits 1 on any violation (the gate for CI)",
        f"  audit: {audit}/%h.%p.jsonl (rankguard report {audit}; rankguard report --map {audit})",
    ], p.stderr
    # The next job in the same directory counts only its own records.
    p = launch("--nproc-per-node", "2", "--", prog("guard_call"), "link", "cuDeviceGet", "0",
               RANKGUARD_AUDIT=f"{audit}/%h.%p.jsonl")
    assert p.returncode == 0, p.stderr
    assert summary_of(p.stderr)[:2] == ["rankguard launch: summary: ranks 0, 1 exited 0; status 0",
                                        "  the guard recorded no violation in this job"], p.stderr


def test_without_an_audit_the_summary_still_counts_and_says_it_was_not_kept(tmp_path):
    p = launch("--nproc-per-node", "2", "--", prog("guard_call"), "link", "cuDeviceGet", "1",
               TMPDIR=str(tmp_path))
    assert p.returncode == 0, p.stderr
    s = summary_of(p.stderr)
    assert s[1:3] == ["  the guard recorded 2 violations in this job: 2 denied",
                      "  R2 cuda:0 only: 2 denied in ranks 0, 1 (cuDeviceGet x2)"], p.stderr
    assert s[-1].startswith("  audit: not kept (RANKGUARD_AUDIT is unset; set RANKGUARD_AUDIT="), p.stderr
    assert list(tmp_path.iterdir()) == [], "the private audit directory is removed at exit"
    # A clean job without an audit: one line of summary, no advice.
    p = launch("--nproc-per-node", "2", "--", "true", TMPDIR=str(tmp_path))
    assert p.returncode == 0 and summary_of(p.stderr) == [
        "rankguard launch: summary: ranks 0, 1 exited 0; status 0",
        "  the guard recorded no violation in this job"], p.stderr


def test_a_failing_rank_is_in_the_summary(tmp_path):
    # Rank 1 fails only once rank 0 has ended and launch has reaped it (a zombie still
    # answers `kill -0`), so the order of the two ends is the test's, not the machine load's.
    script = ('if [ "$RANK" = 0 ]; then echo $$ > "$W/r0"; exit 0; fi; i=0; '
              'while [ ! -s "$W/r0" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; '
              'while kill -0 "$(cat "$W/r0")" 2>/dev/null && [ $i -lt 4000 ]; do sleep 0.01; i=$((i+1)); done; '
              'exit 3')
    p = launch("--nproc-per-node", "2", "--", "sh", "-c", script, TMPDIR=str(tmp_path), W=str(tmp_path))
    assert p.returncode == 3, p.stderr
    assert summary_of(p.stderr)[0] == "rankguard launch: summary: rank 0 exited 0, rank 1 exited 3; status 3", \
        p.stderr


def test_an_audit_directory_no_rank_could_write_is_refused_before_any_rank_starts(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    for template, why in ((f"{tmp_path}/missing/%h.%p.jsonl",
                           f"its directory {tmp_path}/missing does not exist; create it "
                           f"(mkdir -p {tmp_path}/missing)"),
                          (f"{f}/%p.jsonl", f"its directory {f} is not a directory"),
                          (f"{tmp_path}/%p/x.jsonl", "holds %p in its directory part")):
        pids = tmp_path / "pids"
        pids.mkdir(exist_ok=True)
        p = launch("--nproc-per-node", "4", "--", *child_cmd("--pid-dir", str(pids)),
                   RANKGUARD_AUDIT=template)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rankguard launch: error: RANKGUARD_AUDIT="), p.stderr
        assert why in lines[0] and lines[0].endswith("; no rank was started"), p.stderr
        assert list(pids.iterdir()) == [], "a rank started"


def test_without_tmpdir_the_private_directories_are_made_in_dev_shm_and_go_at_exit(tmp_path):
    """The notes and the private audit directory go under `$TMPDIR` when it is set (the tests
    above), else under /dev/shm, memory (src/cli/scratch.rs: on a node whose /tmp is a
    journaling disk file system, creating and removing them was a measured share of an
    8-rank launch's own time, docs/benchmarks.md, "The launcher's directories"); mode 0700,
    gone when the launch ends, whatever the base."""
    import os
    import pathlib
    seen = tmp_path / "seen"
    script = f'for d in "$RANKGUARD_LAUNCH_DIR" "$(dirname "$RANKGUARD_AUDIT")"; do ' \
             f'stat -c "%n %a" "$d"; done > {seen}'
    p = launch("--nproc-per-node", "1", "--", "sh", "-c", script, TMPDIR=None)
    assert p.returncode == 0, p.stderr
    dirs = [ln.rsplit(" ", 1) for ln in seen.read_text().splitlines()]
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else "/tmp"
    assert [pathlib.Path(d).parent for d, _ in dirs] == [pathlib.Path(base)] * 2, dirs
    assert [pathlib.Path(d).name.split("-")[1] for d, _ in dirs] == ["launch", "audit"], dirs
    assert [mode for _, mode in dirs] == ["700", "700"], dirs
    assert not any(os.path.exists(d) for d, _ in dirs), "removed when the launch ended"
