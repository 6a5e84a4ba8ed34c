"""numba-cuda IPC between two processes of a rank (test_numba_cuda.py): the parent puts
bytes in a device array and pickles its IPC handle to a child (`parent [CVD]`: the child
gets that CUDA_VISIBLE_DEVICES, the legacy re-pointing), which opens it and checks them
through a host copy."""
import os, pickle, site, subprocess, sys
site.addsitedir(os.environ["NUMBA_CUDA_DIR"])   # its .pth maps numba.cuda to numba-cuda
import numpy as np
from numba import cuda
if sys.argv[1] == "parent":
    a = cuda.to_device(np.arange(1024, dtype=np.uint8))
    h = a.get_ipc_handle()
    env = dict(os.environ)
    if len(sys.argv) > 2:
        env["CUDA_VISIBLE_DEVICES"] = sys.argv[2]
    p = subprocess.run([sys.executable, __file__, "child"], input=pickle.dumps(h), capture_output=True, env=env)
    sys.stderr.write(p.stderr.decode())
    print("parent ok child rc", p.returncode, p.stdout.decode().strip())
else:
    h = pickle.loads(sys.stdin.buffer.read())
    with h as arr:
        got = arr.copy_to_host()
    print("child ok", bool((got == np.arange(1024, dtype=np.uint8)).all()))
