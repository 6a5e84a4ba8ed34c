"""The layers of the interposer and of the CLI (docs/design.md §2).

src/guard (the `//!` of src/guard/mod.rs): every file lives in a numbered layer folder
(`1_sys/` .. `8_hooks/`), and its imports run only downward: a path
`crate::guard::<layer>::<module>` (in a `use` or written out, macro bodies'
`$crate::guard::...` included) may name its own layer or a lower one, and the files'
imports form no circle (within a layer too). The order is read from the tree itself:
guard/mod.rs's `#[path = "N_name/mod.rs"] pub mod name;` lines, N being the layer's place.

src/cli (the `//!` of src/cli/mod.rs, a numbered list of layers): the same rule for its
modules, over the binary's other modules and the core crate, which never name it (below,
`cli_problems`).

A failure names the file, the line and the name.
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


# ---- src/cli -------------------------------------------------------------------------------
# The CLI's layers are written once, in the `//!` of src/cli/mod.rs: a numbered list
# (`//! N. **name**: ...`) naming, in backticks, each module of that layer (`exit`, `args`, ..).
# mod.rs itself, the dispatch, stands above them all. A module may name (`super::x`,
# `super::{x, ..}`, `crate::cli::x`) a module of its own layer or a lower one, never an item
# of mod.rs; the modules' imports form no circle. Below every layer of src/cli stand the
# binary's other modules (src/main.rs: the core crate's modules it imports, `plan`,
# `cpuset`, `topology`): a `crate::x` path of src/cli must name one of them, and none of
# them (src/*.rs but main.rs and lib.rs, and crates/core) may name src/cli.

CLI_LAYER = re.compile(r"^\s*(\d+)\.\s+\*\*(\w+)\*\*")
CLI_MOD = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([\w ]+\))?\s+)?mod\s+(\w+)\s*;", re.M)
CLI_PATH = re.compile(r"\b(super(?:::super)?|crate::cli|crate)::(\w+|\{[^}]*\})")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{")


def cli_layers(cli: pathlib.Path) -> dict[str, int]:
    """Module name -> its layer's place, from the numbered list of mod.rs's `//!`."""
    found, place = {}, None
    for line in (cli / "mod.rs").read_text().splitlines():
        if not line.startswith("//!"):
            if found:
                break
            continue
        text = line[3:]
        m = CLI_LAYER.match(text)
        if m:
            place = int(m.group(1))
        elif not text.strip():
            place = None
        if place is not None:
            for name in re.findall(r"`(\w+)`", text[m.end():] if m else text):
                found.setdefault(name, place)
    return found


def group_parts(body: str) -> list[str]:
    """`{a, b::c, self}` -> ['a', 'b']; a plain name -> [name]."""
    if not body.startswith("{"):
        return [body]
    parts = [p.strip().split("::")[0].strip() for p in body[1:-1].split(",")]
    return [p for p in parts if p and p != "self"]


def binary_modules(root: pathlib.Path) -> set[str]:
    """What src/main.rs puts beside `cli`: the core crate's modules it imports, its own `mod`s."""
    text = strip_comments((root / "src" / "main.rs").read_text())
    names = set(CLI_MOD.findall(text))
    for body in re.findall(r"\buse\s+rankguard_core::\{([^}]*)\}", text):
        names.update(p.strip() for p in body.split(",") if p.strip())
    names.update(re.findall(r"\buse\s+rankguard_core::(\w+)\s*;", text))
    names.discard("cli")
    return names


def cli_imports(text: str, modules: set[str]):
    """(line, kind, name) for each name a cli file takes from src/cli or the crate: kind 'cli'
    (a module of src/cli), 'mod.rs' (an item of mod.rs), or 'crate' (`crate::x`, x not cli).
    In a `#[cfg(test)] mod` (to the file's end) `super` is the file itself."""
    code = strip_comments(text)
    t = TEST_MOD.search(code)
    tests_at = t.start() if t else len(code)
    for m in CLI_PATH.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        head, body = m.group(1), m.group(2)
        in_tests = m.start() >= tests_at
        if head == "crate":
            for part in group_parts(body):
                yield line, "crate", part
            continue
        if head == "super" and in_tests:
            continue  # the file's own items
        if head == "super::super" and not in_tests:
            continue  # above src/cli: reported as `crate` paths would be; none today
        for part in group_parts(body):
            if part == "*":
                yield line, "mod.rs", "*"
            else:
                yield line, ("cli" if part in modules else "mod.rs"), part


def cli_problems(root: pathlib.Path) -> list[str]:
    cli = root / "src" / "cli"
    order = cli_layers(cli)
    out = []
    if not order:
        out.append("src/cli/mod.rs: its `//!` declares no layer (`//! 1. **name**: `module`, ..`)")
    declared = set(CLI_MOD.findall(strip_comments((cli / "mod.rs").read_text())))
    files = {p.stem for p in cli.glob("*.rs") if p.name != "mod.rs"}
    for name in sorted(files - set(order)):
        out.append(f"src/cli/{name}.rs: in no layer of src/cli/mod.rs's `//!`")
    for name in sorted(set(order) - files):
        out.append(f"src/cli/mod.rs: its `//!` names `{name}` in layer {order[name]}, which is no file of src/cli")
    for name in sorted(files - declared):
        out.append(f"src/cli/{name}.rs: not declared (`mod {name};`) in src/cli/mod.rs")
    below = binary_modules(root)
    edges: dict[str, dict[str, list[str]]] = {}
    for name in sorted(files):
        rel = f"src/cli/{name}.rs"
        mine = order.get(name, 0)
        for line, kind, part in cli_imports((cli / f"{name}.rs").read_text(), files):
            if kind == "crate":
                if part != "cli" and part not in below:
                    out.append(f"{rel}:{line}: imports crate::{part}, which is neither a core module "
                               f"src/main.rs imports nor one of its own ({', '.join(sorted(below))})")
                continue
            if kind == "mod.rs":
                out.append(f"{rel}:{line}: imports {part} from src/cli/mod.rs (the dispatch, above "
                           "every layer): an import may only run down")
                continue
            if part in order and order[part] > mine:
                out.append(f"{rel}:{line}: imports {part} (layer {order[part]}) from layer {mine}: "
                           "an import may only run down")
            if part != name:
                edges.setdefault(name, {}).setdefault(part, []).append(f"{rel}:{line}")
    # mod.rs names its modules bare (`launch::plan_main`).
    mod_code = strip_comments((cli / "mod.rs").read_text())
    for m in re.finditer(r"(?<![\w:])(\w+)::", mod_code):
        if m.group(1) in files:
            line = mod_code.count("\n", 0, m.start()) + 1
            edges.setdefault("mod", {}).setdefault(m.group(1), []).append(f"src/cli/mod.rs:{line}")
    out.extend(circles(edges))
    # Nothing below src/cli names it.
    lower = [p for p in (root / "src").glob("*.rs") if p.name not in ("main.rs", "lib.rs")]
    lower += sorted((root / "crates" / "core" / "src").rglob("*.rs"))
    for f in lower:
        code = strip_comments(f.read_text())
        for m in re.finditer(r"\bcrate::cli\b|\brankguard::cli\b", code):
            line = code.count("\n", 0, m.start()) + 1
            out.append(f"{f.relative_to(root).as_posix()}:{line}: names src/cli, which stands above it")
    return out


def test_cli_imports_run_only_down_its_layers():
    bad = cli_problems(ROOT)
    assert not bad, "src/cli's imports against its layers (src/cli/mod.rs):\n" + "\n".join(bad)


def test_the_cli_check_catches_an_import_that_runs_up(tmp_path):
    cli = tmp_path / "src" / "cli"
    cli.mkdir(parents=True)
    (tmp_path / "src" / "main.rs").write_text("use rankguard_core::{cvd, jobid};\nmod cli;\nmod plan;\n")
    (tmp_path / "src" / "plan.rs").write_text("use crate::cvd;\nfn f() { crate::cli::low::g(); }\n")
    (cli / "mod.rs").write_text(
        "//! Layers:\n//! 1. **base**: `low` and\n//!    `other`\n//! 2. **top**: `high`\n//!\n//! Not `counted`.\n"
        "mod high;\nmod low;\nmod other;\npub struct Error;\nfn main() { high::main(); }\n")
    (cli / "low.rs").write_text(
        "use super::Error;\nuse super::{other, high};\n// super::high in a comment\n"
        "fn g() { crate::cvd::x(); crate::topology::y(); }\n"
        "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::other;\n}\n")
    (cli / "other.rs").write_text("use super::low::g;\n")
    (cli / "high.rs").write_text("use super::{low, other};\nuse crate::plan;\n")
    bad = cli_problems(tmp_path)
    assert any(p.startswith("src/cli/low.rs:1: imports Error from src/cli/mod.rs") for p in bad), bad
    assert any(p.startswith("src/cli/low.rs:2: imports high (layer 2) from layer 1") for p in bad), bad
    assert any(p.startswith("src/cli/low.rs:4: imports crate::topology") for p in bad), bad
    assert any(p.startswith("import circle low -> other -> low") for p in bad), bad
    assert any(p.startswith("src/plan.rs:2: names src/cli") for p in bad), bad
    assert not any(p.startswith("src/cli/high.rs") for p in bad), bad
    assert not any(":3:" in p or ":8:" in p or ":9:" in p for p in bad if p.startswith("src/cli/low.rs")), bad
    assert not any("counted" in p for p in bad), bad


def test_one_walk_of_the_loaded_objects_one_basename_one_json_escape():
    """Logic written once (issue 30): the loaded objects are walked by guard::sys::loaded
    alone (one dl_iterate_phdr visitor), a path's file name is its `basename`, and a JSON
    string is escaped by the core's record::json_str, which the CLI's writer calls too."""
    def places(pattern: str, *trees: str) -> list[str]:
        out = []
        for tree in trees:
            for f in sorted((ROOT / tree).rglob("*.rs")):
                code = strip_comments(f.read_text())
                out += [f"{f.relative_to(ROOT).as_posix()}:{code.count(chr(10), 0, m.start()) + 1}"
                        for m in re.finditer(pattern, code)]
        return out

    walks = places(r"\bdl_iterate_phdr\(", "src/guard")
    assert [w.split(":")[0] for w in walks] == ["src/guard/1_sys/loaded.rs"], walks
    bases = places(r"rsplit\(\|&b\| b == b'/'\)", "src/guard")
    assert [b.split(":")[0] for b in bases] == ["src/guard/1_sys/loaded.rs"], bases
    escapes = places(r'"\\\\u\{:04x\}"', "src/cli", "crates/core/src")
    assert [e.split(":")[0] for e in escapes] == ["crates/core/src/record.rs"], escapes


if __name__ == "__main__":
    # python-tests/test_architecture.py [TREE]: report on another checkout (the old layout).
    tree = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    found = problems(tree) + cli_problems(tree)
    print("\n".join(found))
    sys.exit(1 if found else 0)
