"""`python -m rankguard ARGS...` runs the `rankguard` command of this package with ARGS
(`python -m rankguard lib`, `python -m rankguard launch ...`): handy where the scripts
directory is not on PATH. The process is replaced, so exit status and signals are the
command's own."""
import os
import sys

from . import executable


def main() -> None:
    exe = executable()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
