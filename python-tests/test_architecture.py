"""The interposer's layers (docs/design.md §2, the `//!` of src/guard/mod.rs): every file of
src/guard lives in a numbered layer folder (`1_sys/` .. `8_hooks/`), and its imports run
only downward: a path `crate::guard::<layer>::<module>` (in a `use` or written out, macro
bodies' `$crate::guard::...` included) may name its own layer or a lower one, and the files'
imports form no circle (within a layer too). A failure names the file, the line and the name.

The order is read from the tree itself: guard/mod.rs's `#[path = "N_name/mod.rs"] pub mod
name;` lines, N being the layer's place.
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYER_DECL = re.compile(r'#\[path\s*=\s*"(\d+)_(\w+)/mod\.rs"\]\s*(?:#\[[^\]]*\]\s*)*pub\s+mod\s+(\w+)\s*;')
PATH = re.compile(r"\$?crate::guard::(\w+)(?:::(\w+|\{[^}]*\}))?")
USE_GROUP = re.compile(r"\buse\s+crate::guard::\{([^;]*)\};", re.S)


def strip_comments(text: str) -> str:
    """The text with `//` comments blanked (line numbers kept); string literals stay."""
    out = []
    for line in text.splitlines():
        i = line.find("//")
        out.append(line if i < 0 else line[:i])
    return "\n".join(out)


def layers(guard: pathlib.Path) -> dict[str, int]:
    """Layer name -> its place, from guard/mod.rs."""
    text = (guard / "mod.rs").read_text()
    found = {}
    for num, folder, name in LAYER_DECL.findall(text):
        assert folder == name, f"src/guard/mod.rs: folder {num}_{folder} declares module {name}"
        found[name] = int(num)
    return found


def module_of(guard: pathlib.Path, f: pathlib.Path, order: dict[str, int]) -> tuple[str, str] | None:
    """(layer, module) of a file: `N_layer/x.rs` -> (layer, x); a layer's mod.rs -> (layer, '')."""
    rel = f.relative_to(guard)
    if len(rel.parts) != 2:
        return None
    m = re.fullmatch(r"(\d+)_(\w+)", rel.parts[0])
    if not m or m.group(2) not in order:
        return None
    return m.group(2), ("" if rel.name == "mod.rs" else rel.stem)


def imports(text: str):
    """(line, layer, module or '') for every guard path in the text."""
    code = strip_comments(text)
    for m in PATH.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        first, second = m.group(1), m.group(2) or ""
        if second.startswith("{"):
            for part in second[1:-1].split(","):
                part = part.strip().split("::")[0].strip()
                if part:
                    yield line, first, part
        else:
            yield line, first, second
    for m in USE_GROUP.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        for part in m.group(1).split(","):
            part = part.strip().split("::")[0].strip()
            if part:
                yield line, part, ""


def problems(root: pathlib.Path) -> list[str]:
    guard = root / "src" / "guard"
    order = layers(guard)
    out = []
    if not order:
        out.append("src/guard/mod.rs: declares no layer (`#[path = \"N_name/mod.rs\"] pub mod name;`)")
    files = sorted(p for p in guard.rglob("*.rs") if p != guard / "mod.rs")
    edges: dict[str, dict[str, list[str]]] = {}
    for f in files:
        rel = f.relative_to(root).as_posix()
        here = module_of(guard, f, order)
        text = f.read_text()
        if here is None:
            out.append(f"{rel}: not in a layer folder of src/guard/mod.rs ({', '.join(sorted(order)) or 'none'})")
            # Still read its imports for the circle check, by module name.
            here = ("", f.stem)
        mine = order.get(here[0], 0)
        for line, layer, module in imports(text):
            if layer not in order:
                # A flat path (`crate::guard::state`): a module in no layer.
                out.append(f"{rel}:{line}: imports crate::guard::{layer}, which is not a layer")
                target = layer
            else:
                if order[layer] > mine:
                    out.append(f"{rel}:{line}: imports crate::guard::{layer}::{module} "
                               f"(layer {order[layer]} {layer}) from layer {mine} {here[0]}: "
                               "an import may only run down")
                target = f"{layer}::{module}" if module else layer
            src = f"{here[0]}::{here[1]}" if here[0] else here[1]
            if target != src and not (here[1] == "" and target.startswith(here[0] + "::")):
                edges.setdefault(src, {}).setdefault(target, []).append(f"{rel}:{line}")
    out.extend(circles(edges))
    return out


def circles(edges: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every import circle among the modules, each with the lines that close it."""
    out, seen, stack, on = [], set(), [], set()

    def visit(n: str):
        seen.add(n)
        stack.append(n)
        on.add(n)
        for m in sorted(edges.get(n, {})):
            if m in on:
                cyc = stack[stack.index(m):] + [m]
                where = "; ".join(f"{a} -> {b} at {edges[a][b][0]}" for a, b in zip(cyc, cyc[1:]))
                out.append(f"import circle {' -> '.join(cyc)}: {where}")
            elif m not in seen:
                visit(m)
        stack.pop()
        on.discard(n)

    for n in sorted(edges):
        if n not in seen:
            visit(n)
    return out


def test_guard_imports_run_only_down_the_layers():
    bad = problems(ROOT)
    assert not bad, "src/guard's imports against its layers:\n" + "\n".join(bad)


def test_the_check_catches_an_import_that_runs_up(tmp_path):
    # The check itself: a lower layer naming a higher one, and a circle, are both reported.
    g = tmp_path / "src" / "guard"
    (g / "1_low").mkdir(parents=True)
    (g / "2_high").mkdir()
    (g / "mod.rs").write_text('#[path = "1_low/mod.rs"]\npub mod low;\n#[path = "2_high/mod.rs"]\npub mod high;\n')
    (g / "1_low" / "mod.rs").write_text("pub mod a;\npub mod b;\n")
    (g / "1_low" / "a.rs").write_text("use crate::guard::low::b;\n// crate::guard::high::c in a comment\n")
    (g / "1_low" / "b.rs").write_text("fn f() { crate::guard::low::a::g(); $crate::guard::high::c::h(); }\n")
    (g / "2_high" / "mod.rs").write_text("pub mod c;\n")
    (g / "2_high" / "c.rs").write_text("use crate::guard::low::{a, b};\n")
    bad = problems(tmp_path)
    assert any("src/guard/1_low/b.rs:1: imports crate::guard::high::c" in p for p in bad), bad
    assert any(p.startswith("import circle low::a -> low::b -> low::a") for p in bad), bad
    assert not any(p.startswith("src/guard/2_high") for p in bad), bad
    assert not any("a.rs:2" in p for p in bad), bad


if __name__ == "__main__":
    # python-tests/test_architecture.py [TREE]: report on another checkout (the old layout).
    found = problems(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(found))
    sys.exit(1 if found else 0)
