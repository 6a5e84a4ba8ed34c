"""R1 at CUDA initialisation, per CUDA_VISIBLE_DEVICES form and per mode (issue 3), and
the guard's zero effect on processes that never touch CUDA."""
from __future__ import annotations

import signal

import pytest

from conftest import PYTHON
from _guard import guarded, prog

GPU2 = "GPU-12c0ffee-0000-4000-8000-000000000002"
MIG_1_0 = "MIG-1100a11c-0000-4000-8000-000000000100"   # MIG instance 0 of GPU 1

# (id, CVD, extra env, devices the process sees, R1 violated?)
CASES = [
    ("unset", None, {}, 8, True),
    ("two", "0,1", {}, 2, True),
    ("uuid", GPU2, {}, 1, False),
    ("uuid-prefix", "GPU-12", {}, 1, False),
    ("mig", MIG_1_0, {"FAKECUDA_MIG": "1:2"}, 1, False),
    ("mig-unknown", MIG_1_0, {}, 0, True),
    ("empty", "", {}, 0, False),
    ("minus-one", "-1", {}, 0, False),
]


@pytest.mark.parametrize("cvd,env,devices,violated", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["enforce", "warn", "abort", "off"])
@pytest.mark.parametrize("api", ["driver", "runtime"])
def test_r1_outcomes(tmp_path, api, mode, cvd, env, devices, violated):
    args = [prog("guard_init")] + (["rt"] if api == "runtime" else [])
    r = guarded(args, tmp_path, cvd=cvd, mode=mode, **env)
    r1 = [x for x in r.audit if x["rule"] == "R1"]
    if violated and mode == "enforce":
        assert r.rc == 78, r.out + r.err
        assert "RANKGUARD DENY cuInit(" in r.err and "[R1 one GPU per rank]" in r.err
        assert "exit status 78" in r.err
        assert r.out == ""
        assert len(r1) == 1 and r1[0]["verdict"] == "deny"
        assert r1[0]["devices"] == devices
    elif violated and mode == "abort":
        assert r.rc == -signal.SIGABRT, r.out + r.err
        assert len(r1) == 1
    else:
        assert r.rc == 0, r.out + r.err
        count = r.value("count")
        assert count == (devices if devices else count)
        if devices == 0:
            # No GPU given on purpose (or a MIG entry naming nothing, in warn/off): the
            # driver's own "no device" answer, CUDA_ERROR_NO_DEVICE / cudaErrorNoDevice.
            assert r.value("cuInit" if api == "driver" else "cudaGetDeviceCount") == 100
        if violated and mode == "warn":
            assert len(r1) == 1 and r1[0]["verdict"] == "warn"
            assert "allowed (warn mode)" in r.err
        else:
            assert r1 == [], r.audit
            assert "RANKGUARD" not in r.err


@pytest.mark.parametrize("cmd", [["/bin/true"], [PYTHON, "-c", "pass"],
                                 ["/bin/sh", "-c", "echo hello; ls / >/dev/null"]])
def test_process_without_cuda_is_untouched(tmp_path, cmd):
    """No output, no audit file, same result, whatever the (violating) environment."""
    plain = guarded(cmd, tmp_path, cvd=None, preload=False)
    r = guarded(cmd, tmp_path, cvd=None, mode="enforce", RANKGUARD_DEBUG="TRACE")
    assert (r.rc, r.out, r.err) == (plain.rc, plain.out, plain.err)
    assert r.audit == []
    assert not list(tmp_path.glob("audit-*"))


def test_invalid_mode_fails_closed_and_says_so(tmp_path):
    r = guarded([prog("guard_call"), "link", "cuDeviceGet", "1"], tmp_path, cvd="3",
                mode="warning")
    assert r.value("rc") == 101
    assert 'RANKGUARD_MODE="warning" is not valid' in r.err
