"""rankguard for Python users: the `rankguard` command installed by this wheel, `lib()`,
the path of librankguard.so for `LD_PRELOAD`, and the launcher API: `plan()` (the ranks
`rankguard launch` would start, each with its complete environment and CPU block, for a
framework that starts its ranks itself) and `check()` (`rankguard check --json`, typed).

The wheel carries one native file, the `rankguard` binary (a script of this distribution);
the library travels inside it and `rankguard lib` writes it once to the user's cache
(`$XDG_CACHE_HOME/rankguard/<version>-<hash>/`), so both always agree on which library a
rank gets. Nothing here imports CUDA or touches the GPU.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sysconfig

__all__ = ["CheckResult", "ConflictError", "ContractError", "Rank", "RankguardError", "check", "executable",
           "lib", "plan"]


def executable() -> str:
    """The `rankguard` binary installed with this package."""
    candidates = []
    try:
        from importlib import metadata

        dist = metadata.distribution("rankguard")
        for f in dist.files or ():
            if f.name == "rankguard" and f.parent.name in ("bin", "Scripts"):
                candidates.append(pathlib.Path(dist.locate_file(f)))
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        pass
    candidates.append(pathlib.Path(sysconfig.get_path("scripts")) / "rankguard")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c.resolve())
    found = shutil.which("rankguard")
    if found:
        return found
    raise FileNotFoundError(
        "the rankguard executable of this package was not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + " and PATH); reinstall it: pip install --force-reinstall rankguard")


def lib() -> str:
    """Absolute path of librankguard.so, as `rankguard lib` prints it."""
    p = subprocess.run([executable(), "lib"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip() or f"rankguard lib exited {p.returncode}")
    return p.stdout.strip()


# The launcher API (after executable(), which it uses).
from .api import CheckResult, ConflictError, ContractError, Rank, RankguardError, check, plan  # noqa: E402
