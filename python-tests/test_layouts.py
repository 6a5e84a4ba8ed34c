"""Hand-declared CUDA structs of the guard agree with NVIDIA's cuda.h (compile-time
asserts in c-tests/tests/layout_check.c; the Rust side asserts the same numbers)."""
from conftest import TESTS, run


def test_layout_check_compiled_and_runs():
    r = run([TESTS / "layout_check"], check=True)
    assert r.stdout.strip() == "layouts ok"
