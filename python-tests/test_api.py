"""The Python launcher API (`import rankguard`: `plan`, `check`, `ConflictError`), from the
source tree (python/) with the built binary on PATH. The installed wheel and a launcher
built on the API alone are tested in test_install.py.

`plan()` must make exactly the CLI's decisions (it runs `rankguard plan --json --env`), and
each rank's environment must be the one `rankguard launch` gives that rank.
"""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from _cli import CLI, child_cmd, children, clean_env, cli, run, uuid
from conftest import LIB_GUARD, PYTHON, ROOT


def api_env(**extra):
    return clean_env(FAKECUDA_GPUS="8", PYTHONPATH=str(ROOT / "python"),
                     PATH=f"{CLI.parent}:{os.environ['PATH']}", **extra)


def api(code: str, env: dict) -> dict:
    """Run `code` (which sets `out`) with the source package; return `out`."""
    script = "import json, os, rankguard\n" + textwrap.dedent(code) + "\nprint('OUT ' + json.dumps(out))\n"
    p = run([PYTHON, "-c", script], env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.split("OUT ", 1)[1])


PLAN = """
ranks = rankguard.plan(env=dict(os.environ), **json.loads(os.environ["ARGS"]))
out = [dict(rank=r.rank, local_rank=r.local_rank, cvd=r.cuda_visible_devices, uuid=r.uuid, cpus=r.cpus,
            numa=r.numa_node, env=r.env) for r in ranks]
"""

CASES = [
    # (API keyword arguments, the same options for the CLI, extra launcher environment)
    (dict(nproc_per_node=4), ["--nproc-per-node", "4"], {}),
    (dict(devices=[2, 3, 6, 7]), ["--devices", "2,3,6,7"], {}),
    (dict(nproc_per_node="gpu", devices="1-2"), ["--nproc-per-node", "gpu", "--devices", "1-2"], {}),
    (dict(nproc_per_node=2), ["--nproc-per-node", "2"], {"CUDA_VISIBLE_DEVICES": f"{uuid(5)},{uuid(4)[:10]}"}),
    (dict(nproc_per_node=2, cpu_ids=[[1], [0]]), ["--nproc-per-node", "2", "--cpu-ids", "1,0"], {}),
    (dict(nproc_per_node=2, nnodes=2, node_rank=1, master_addr="10.1.2.3", master_port=29555),
     ["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
      "--master-port", "29555"], {}),
]


@pytest.mark.parametrize("kw,flags,extra", CASES)
def test_plan_makes_the_clis_decisions(kw, flags, extra):
    env = api_env(ARGS=json.dumps(kw), **extra)
    ranks = api(PLAN, env)
    ref = json.loads(cli("plan", "--json", *flags, env=env, check=True).stdout)["ranks"]
    assert [(r["rank"], r["local_rank"], r["cvd"], r["uuid"], r["cpus"], r["numa"]) for r in ranks] == \
        [(r["rank"], r["local_rank"], r["cuda_visible_devices"], r["uuid"], r["cpu_list"], r["numa_node"])
         for r in ref]
    for r in ranks:
        e = r["env"]
        # Complete: the launcher's environment is kept, the rank's variables set over it.
        assert e["FAKECUDA_GPUS"] == "8" and e["PYTHONPATH"] == env["PYTHONPATH"]
        assert e["CUDA_VISIBLE_DEVICES"] == e["RANKGUARD_RANK_GPU"] == r["cvd"]
        assert e["LD_PRELOAD"].split(":")[0] == str(LIB_GUARD)  # what `rankguard lib` picks
        assert e["RANK"] == str(r["rank"]) and e["LOCAL_RANK"] == str(r["local_rank"])
    assert len({r["env"]["RANKGUARD_JOB"] for r in ranks}) == 1


@pytest.mark.parametrize("kw,flags,extra", CASES)
def test_each_ranks_env_is_the_one_launch_gives_it(kw, flags, extra):
    """Started with `rankguard launch` and the same options, each child sees exactly the
    variables the API hands out (the job id and port fixed, as a launcher would inherit)."""
    fixed = dict(RANKGUARD_JOB="job-api", LD_PRELOAD="libm.so.6", OMP_NUM_THREADS=None)
    env = api_env(ARGS=json.dumps(dict(kw, master_port=29600)), **fixed, **extra)
    ranks = api(PLAN, env)
    p = cli("launch", *flags, "--master-port", "29600", "--", *child_cmd(), env=env)
    assert p.returncode == 0, p.stderr
    kids = children(p.stdout)
    assert len(kids) == len(ranks)
    for r, k in zip(ranks, kids):
        for var, value in k["env"].items():
            assert r["env"].get(var) == value, (var, r["env"].get(var), value)
        if r["cpus"] is not None:
            assert k["threads_affinity"] == r["cpus"]


@pytest.mark.parametrize("kw,extra,needle", [
    (dict(nproc_per_node=2), {"CUDA_VISIBLE_DEVICES": "3"}, "external single-entry CUDA_VISIBLE_DEVICES"),
    (dict(nproc_per_node=9), {}, "more ranks than devices"),
    (dict(devices=[0, 0]), {}, "--devices"),
    (dict(nproc_per_node=2), {"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, "CUDA_VISIBLE_DEVICES"),
    (dict(nproc_per_node=2, cpu_ids=[[0], [0]]), {}, "--cpu-ids"),
])
def test_where_the_cli_refuses_plan_raises_conflict_error(kw, extra, needle):
    env = api_env(ARGS=json.dumps(kw), **extra)
    out = api("""
        try:
            rankguard.plan(**json.loads(os.environ["ARGS"]))
            out = None
        except rankguard.ConflictError as e:
            out = [str(e), isinstance(e, ValueError), e.command]
    """, env)
    assert out is not None, "no ConflictError"
    msg, is_value_error, command = out
    assert needle in msg and is_value_error, msg
    # the CLI's own message, for the same options
    p = run(command, env=env)
    assert p.returncode == 2 and p.stderr.strip() == _error_line(msg), p.stderr


def _error_line(msg: str) -> str:
    """The CLI's error line for a message (src/cli/mod.rs, error_line): one prefix."""
    head, sep, rest = msg.partition(": ")
    if sep and head.startswith("rankguard ") and " " not in head[len("rankguard "):]:
        return f"{head}: error: {rest}"
    return f"rankguard: error: {msg}"


def test_plan_defaults_to_os_environ():
    env = api_env(CUDA_VISIBLE_DEVICES="6,7")
    out = api("out = [r.cuda_visible_devices for r in rankguard.plan(nproc_per_node=2)]", env)
    assert out == ["6", "7"]


def test_check_is_typed_and_raises_on_request():
    env = api_env()
    out = api("""
        good = rankguard.check(env=dict(os.environ, CUDA_VISIBLE_DEVICES="3"))
        bad = rankguard.check(env=dict(os.environ, CUDA_VISIBLE_DEVICES="0,1"))
        good.raise_if_violated()
        try:
            bad.raise_if_violated()
            raised = None
        except rankguard.ContractError as e:
            raised = e.problems
        out = dict(good=[good.ok, good.mode, good.entries, good.driver.count, good.driver.devices[0].uuid,
                         type(good.driver.devices[0]).__name__, good.guard.preloaded, good.guard.mode],
                   bad=[bad.ok, bad.driver.count, bad.problems], raised=raised)
    """, env)
    assert out["good"] == [True, "index", ["3"], 1, uuid(3), "Device", False, "enforce"]
    ok, count, problems = out["bad"]
    assert not ok and count == 2 and any("makes 2 GPUs visible" in p for p in problems)
    assert out["raised"] == problems
    ref = json.loads(cli("check", "--json", env=dict(env, CUDA_VISIBLE_DEVICES="0,1")).stdout)
    assert ref["problems"] == problems


def test_the_package_is_typed():
    assert (ROOT / "python" / "rankguard" / "py.typed").is_file()
    out = api("""
        import typing
        hints = typing.get_type_hints(rankguard.plan)
        out = sorted(hints) + [str(typing.get_type_hints(rankguard.Rank)["env"])]
    """, api_env())
    assert "return" in out and "env" in out and "cpu_ids" in out
    assert out[-1] == "typing.Dict[str, str]"


def test_a_ranks_repr_does_not_print_its_environment():
    """Issue 32: printing a Rank dumped the launcher's whole environment, secrets included.
    Its repr and str show the rank, its GPU and CPU block, and only how many variables."""
    env = api_env(MY_API_TOKEN="hunter2-secret", AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI")
    out = api("""
        r = rankguard.plan(nproc_per_node=2)[1]
        out = [repr(r), str(r), f"{r}", len(r.env), r.env["MY_API_TOKEN"]]
    """, env)
    text_repr, text_str, text_fmt, n, token = out
    assert token == "hunter2-secret", "env itself still holds every variable"
    for t in (text_repr, text_str, text_fmt):
        assert "hunter2" not in t and "wJalrXUtnFEMI" not in t and "MY_API_TOKEN" not in t, t
        assert t == (f"Rank(rank=1, local_rank=1, cuda_visible_devices='1', uuid='{uuid(1)}', "
                     f"numa_node=None, cpus=None, env=<{n} variables, not shown>)"), t
