"""The import rules, read statically with `ast` from every project module (imports at the top and inside
functions alike): the library (`core/*.py` and `viz/`) never imports the tools (`core.eval`), the training code
(`core.training`) or the app (`app`, `studio`); and no project module reaches itself again through its imports.
Also read with `ast`: no function anywhere in the project (nested ones included) is longer than 80 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFF_LIMITS = ("core.eval", "core.training", "app", "studio")   # what the library may not import
MAX_FUNCTION_LINES = 80                                          # from `def` to the last line; decorators not counted


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for the library, the tools, the training code and the app."""
    files = [*root.glob("core/**/*.py"), *root.glob("viz/*.py"), *root.glob("studio/*.py"), *root.glob("app.py")]
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (`from core import x` counts `core.x`)."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def is_library(name: str) -> bool:
    return under(name, ("core", "viz")) and not under(name, OFF_LIMITS)


def forbidden_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(library module, off-limits module) for every library import of a tool, the training code or the app."""
    return sorted((a, b) for a, deps in graph.items() if is_library(a) for b in deps if under(b, OFF_LIMITS))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk, as the modules along it (first repeated last)."""
    state, path, found = {}, [], []

    def visit(u: str) -> None:
        state[u] = "open"
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(path[path.index(v):] + [v])
            elif v not in state:
                visit(v)
        path.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_the_library_imports_no_tool_training_or_app_module():
    assert forbidden_imports(import_graph(project_modules(ROOT))) == []


def test_no_import_circle():
    assert cycles(import_graph(project_modules(ROOT))) == []


def test_the_checks_catch_a_bad_import_and_a_circle(tmp_path):
    """A library module importing the tools inside a function, the app at the top, and a circle of two."""
    files = {"core/__init__.py": "", "core/eval/__init__.py": "", "core/eval/benchmark.py": "",
             "core/engine.py": "import app\n\ndef f():\n    from core.eval import benchmark\n",
             "core/a.py": "from core import b\n", "core/b.py": "def g():\n    import core.a\n",
             "core/eval/judge.py": "import app\nfrom core.engine import f\n", "app.py": "from core import engine\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(project_modules(tmp_path))
    assert forbidden_imports(graph) == [("core.engine", "app"), ("core.engine", "core.eval"),
                                        ("core.engine", "core.eval.benchmark")]
    assert sorted(map(tuple, cycles(graph))) == [("app", "core.engine", "app"), ("core.a", "core.b", "core.a")]


def long_functions(modules: dict[str, Path], limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str, int]]:
    """(module, function, lines) for every function or method, nested ones included, longer than `limit` lines
    from its `def` to its last line."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((name, node.name, lines))
    return sorted(found)


def test_no_function_over_80_lines():
    assert long_functions(project_modules(ROOT)) == []


def test_the_length_check_catches_a_long_nested_function(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "long.py").write_text(f"def outer():\n    def inner():\n{body}    return inner\n")
    assert long_functions(project_modules(tmp_path)) == [("core.long", "inner", 81), ("core.long", "outer", 83)]
