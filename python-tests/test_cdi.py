"""`rankguard cdi`: a CDI spec that turns the guard on for every container asking for the
device, checked by the CDI project itself and applied the way a runtime applies it.

The spec is validated by the project's schema.json and loaded and injected by its Go library
(Debian's golang-github-container-orchestrated-devices-container-device-interface-dev,
installed by scripts/setup; python-tests/cdi_apply.go, built offline here into target/). The
edited OCI spec's env and bind mount are then applied as runc would: the mount in a private
mount namespace (unshare -m, as root), the env as the process's whole environment, to a
torchrun-style job of 4 ranks that never names rankguard."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from _cli import CHILD, children, clean_env, uuid
from conftest import CLI, LIB_GUARD, PYTHON, ROOT, TESTS

SRC = pathlib.Path(__file__).resolve().parent / "cdi_apply.go"
APPLY = ROOT / "target" / "cdi-apply"
DEVICE = "rankguard.dev/guard=rank"
GUARD_CALL = TESTS / "guard_call"

# torchrun's shape: one agent (no LOCAL_RANK, never touches CUDA) starting 4 ranks.
TORCHRUN = r"""
import os, subprocess, sys
procs = [subprocess.Popen(sys.argv[1:], env=dict(os.environ, LOCAL_RANK=str(r), RANK=str(r), WORLD_SIZE="4"))
         for r in range(4)]
sys.exit(max(p.wait() for p in procs))
"""


@pytest.fixture(scope="module")
def apply():
    assert shutil.which("go"), "go not found: scripts/setup installs golang-go and Debian's CDI package"
    if not APPLY.exists() or APPLY.stat().st_mtime < SRC.stat().st_mtime:
        env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOFLAGS="",
                   GOCACHE=str(ROOT / "target" / "go-cache"))
        p = subprocess.run(["go", "build", "-o", str(APPLY), SRC.name], cwd=SRC.parent, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    return APPLY


def spec(*args: str) -> dict:
    p = subprocess.run([CLI, "cdi", "--lib", str(LIB_GUARD), *args], env=clean_env(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def inject(apply, tmp: pathlib.Path, s: dict, oci: dict, device: str = DEVICE) -> subprocess.CompletedProcess:
    d = tmp / "cdi"
    d.mkdir(exist_ok=True)
    (d / "rankguard.json").write_text(json.dumps(s))
    return subprocess.run([apply, d, device], input=json.dumps(oci), capture_output=True, text=True, timeout=30)


def test_the_whole_spec_is_accepted(apply, tmp_path):
    p = inject(apply, tmp_path, spec(), {"ociVersion": "1.0.2", "process": {"cwd": "/", "env": ["PATH=/usr/bin"]}})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["process"]["env"] == ["PATH=/usr/bin", "LD_PRELOAD=/opt/rankguard/librankguard.so",
                                     "RANKGUARD_MODE=enforce", "RANKGUARD_NARROW_BY=LOCAL_RANK"]
    assert out["mounts"] == [{"destination": "/opt/rankguard/librankguard.so", "type": "bind",
                              "source": str(LIB_GUARD.resolve()), "options": ["ro", "nosuid", "nodev", "bind"]}]


def _set(path, value):
    def f(s):
        *head, last = path
        for k in head:
            s = s[k]
        if value is KeyError:
            del s[last]
        else:
            s[last] = value
    return f


EDITS = ("devices", 0, "containerEdits")
MUTATIONS = {
    "unknown version": (_set(["cdiVersion"], "9.9"), "invalid version"),
    "kind without class": (_set(["kind"], "rankguard.dev"), "vendor name"),
    "no kind": (_set(["kind"], KeyError), "kind"),
    "bad device name": (_set(["devices", 0, "name"], "rank 0"), "name"),
    "a mount option not a string": (_set([*EDITS, "mounts", 0, "options", 0], 7), "string"),
    "a mount without its host path": (_set([*EDITS, "mounts", 0, "hostPath"], KeyError), "hostPath"),
    "an env entry not a string": (_set([*EDITS, "env", 0], ["LD_PRELOAD"]), "string"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_a_broken_spec_is_rejected_by_the_cdi_project(apply, tmp_path, name):
    mutate, needle = MUTATIONS[name]
    s = spec()
    mutate(s)
    p = inject(apply, tmp_path, s, {"ociVersion": "1.0.2", "process": {"cwd": "/", "env": []}})
    assert p.returncode == 1 and p.stderr.startswith("cdi: "), (p.returncode, p.stdout, p.stderr)
    assert needle in p.stderr, p.stderr


def test_an_unknown_device_is_refused(apply, tmp_path):
    p = inject(apply, tmp_path, spec(), {"process": {"env": []}}, device="rankguard.dev/guard=other")
    assert p.returncode == 1 and "unresolvable CDI devices" in p.stderr, p.stderr


def mount_point(tmp: pathlib.Path) -> pathlib.Path:
    return tmp / "ctr" / "opt" / "rankguard" / "librankguard.so"


def container(apply, tmp: pathlib.Path, argv: list) -> tuple[subprocess.CompletedProcess, str]:
    """argv in a 'container': the CDI edits of the spec applied to an 8-GPU environment."""
    assert os.geteuid() == 0, "the CDI job mounts in a private mount namespace: run it as root"
    at = mount_point(tmp)
    at.parent.mkdir(parents=True)
    at.touch()  # the mount point; the runtime creates it in the container's root
    base = clean_env(FAKECUDA_GPUS="8", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    oci = {"ociVersion": "1.0.2", "process": {"cwd": "/", "env": [f"{k}={v}" for k, v in base.items()]}}
    p = inject(apply, tmp, spec("--mount-at", str(at)), oci)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    env_list = out["process"]["env"]
    env = dict(e.split("=", 1) for e in env_list)
    assert len(env) == len(env_list), "the edits repeat a variable"
    (m,) = out["mounts"]
    ro = ",".join(o for o in m["options"] if o != "bind")
    # The runtime's own steps run before the container's process: without its env's preload.
    script = ('set -e; mount --make-rprivate /; mount --bind "$1" "$2"; mount -o "remount,bind,$3" "$2"; '
              'export LD_PRELOAD="$4"; shift 4; exec "$@"')
    setup = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    return subprocess.run(["unshare", "-m", "--", "sh", "-c", script, "sh", m["source"], m["destination"], ro,
                           env["LD_PRELOAD"], *map(str, argv)], env=setup, capture_output=True, text=True,
                          timeout=60), str(at)


def test_a_torchrun_style_job_is_guarded_and_narrowed_by_the_cdi_edits(apply, tmp_path):
    p, at = container(apply, tmp_path, [PYTHON, "-c", TORCHRUN, PYTHON, CHILD])
    assert p.returncode == 0, p.stdout + p.stderr
    kids = children(p.stdout)
    assert [k["env"]["RANK"] for k in kids] == ["0", "1", "2", "3"]
    for r, k in enumerate(kids):
        assert k["env"]["LD_PRELOAD"] == at and k["guard_loaded"], k
        assert k["env"]["CUDA_VISIBLE_DEVICES"] == str(r) and k["env"]["RANKGUARD_RANK_GPU"] == str(r)
        assert k["cuda"]["count"] == 1 and k["cuda"]["devices"][0]["uuid"] == uuid(r)
    assert "RANKGUARD" not in p.stderr, p.stderr
    # The guard is mounted read-only: the job cannot replace it.
    w = tmp_path / "w"
    q, _ = container(apply, w, ["sh", "-c", f'echo x > "{mount_point(w)}"'])
    assert q.returncode != 0 and "Read-only file system" in q.stderr, q.stderr


def test_a_legacy_rank_in_the_cdi_job_is_refused(apply, tmp_path):
    p, _ = container(apply, tmp_path, [PYTHON, "-c", TORCHRUN, "sh", "-c",
                                       f'exec {GUARD_CALL} link cuDeviceGet "$LOCAL_RANK"'])
    codes = sorted(ln.split("rc=", 1)[1] for ln in p.stdout.splitlines() if "rc=" in ln)
    assert codes == ["0", "101", "101", "101"], p.stdout + p.stderr
    for r in (1, 2, 3):
        assert any("RANKGUARD DENY cuDeviceGet(" in ln and f"ordinal={r}" in ln and "R2" in ln
                   for ln in p.stderr.splitlines()), p.stderr
