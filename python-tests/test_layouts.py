"""Hand-declared CUDA structs of the guard agree with NVIDIA's cuda.h (compile-time
asserts in c-tests/tests/layout_check.c against 12.9, c-tests/tests13/layout_check13.c
against 13.x for 13-only structs; the Rust side asserts the same numbers)."""
import pytest

from conftest import TESTS, run


@pytest.mark.parametrize("name", ["layout_check", "layout_check13"])
def test_layout_check_compiled_and_runs(name):
    r = run([TESTS / name], check=True)
    assert r.stdout.strip() == "layouts ok"
