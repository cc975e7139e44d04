"""The package's shape: imports point one way (down the layers of docs/design.md), no cycles,
in-function imports only for optional dependencies, the offline tools out of the request path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tessera"

# Lowest first; a module may import from its own layer or any layer below, never above.
LAYERS: list[tuple[str, ...]] = [
    ("tessera._array", "tessera.autograd", "tessera.checks", "tessera.distribution",
     "tessera.dtypes", "tessera.settings",
     "tessera.runtime.queue",
     "tessera.cuda", "tessera.cuda.gen_wgmma", "tessera.runtime"),
    ("tessera.cuda.device",),
    ("tessera.cuda.variants", "tessera.cuda.tma"),
    ("tessera.cuda.loader",),
    ("tessera.interop", "tessera.capture"),
    ("tessera.streams",),
    ("tessera.mask",),
    ("tessera.operands", "tessera.reference", "tessera.families"),
    ("tessera.quantization",),
    ("tessera.launch", "tessera.backward_launch", "tessera.quantize_launch"),
    ("tessera.runtime.planner_launches",),
    ("tessera.runtime.mapping",),
    ("tessera.runtime.tasks",),
    ("tessera.runtime.device_planner",),
    ("tessera.runtime.regime",),
    ("tessera.runtime.planners",),
    ("tessera.runtime.backward",),
    ("tessera.runtime.plan",),
    ("tessera.runtime.cache", "tessera.runtime.emulate"),
    ("tessera.api",),
    ("tessera",),
    ("tessera.integrations", "tessera.integrations.methods",
     "tessera.integrations.torch_attention", "tessera.integrations.video_models",
     "tessera.integrations.jax_attention"),
    ("tessera.integrations.presets",),
    ("tessera.integrations.diffusers", "tessera.integrations.distributed"),
    ("tessera.tools", "tessera.__main__"),
]
# Imported inside functions only: optional dependencies, loaded when a feature needs them.
OPTIONAL = {"cupy", "cupy_backends", "torch", "jax", "jaxlib", "matplotlib", "diffusers",
            "ml_dtypes", "cudnn", "flash_attn", "lpips"}  # (cudnn, flash_attn: peers the
# benchmarks time; lpips: the quality report's frame distance, where installed)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The tessera modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "tessera"]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        full = ".".join(base + ([node.module] if node.module else []))
    else:
        full = node.module or ""
    if full.split(".")[0] != "tessera":
        return []
    subs = [f"{full}.{a.name}" for a in node.names if f"{full}.{a.name}" in known]
    # ``from pkg import sub`` loads the submodule; any other name comes from pkg itself.
    return subs + ([full] if len(subs) < len(node.names) else [])


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Module-level tessera imports of every module -- those of TYPE_CHECKING blocks too: a
    loop through an annotation is still a loop -- and every import inside a function as
    (module, line, imported name)."""
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    in_functions = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef,
                                                          ast.AsyncFunctionDef))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if in_function:
                        top = (child.names[0].name if isinstance(child, ast.Import)
                               else ("." if child.level else child.module or ""))
                        in_functions.append((name, child.lineno, top))
                    else:
                        graph[name].update(t for t in _targets(child, name, is_pkg, known)
                                           if t in known and t != name)
                visit(child, inner)

        visit(tree, False)
    return graph, in_functions


def _layer(module: str) -> int:
    """The layer of the most specific LAYERS entry naming ``module`` or a package above it."""
    found = [(len(m), i) for i, members in enumerate(LAYERS) for m in members
             if module == m or (m != "tessera" and module.startswith(m + "."))]
    if not found:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it where it belongs")
    return max(found)[1]


def test_every_module_has_a_layer():
    for name in _modules():
        _layer(name)


def test_no_import_cycles():
    graph, _ = _imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                walk(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)


def test_imports_point_down_the_layers():
    graph, _ = _imports()
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in sorted(graph.items()) for t in sorted(targets)
              if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_in_function_imports_are_optional_dependencies_only():
    _, in_functions = _imports()
    bad = [f"{m}:{line} imports {what} inside a function" for m, line, what in in_functions
           if what.split(".")[0] not in OPTIONAL]
    assert not bad, "\n".join(bad)


def test_request_path_never_loads_the_tools():
    """What ``import tessera`` loads (the front door and everything below it) never reaches
    the offline tools (CLI, benchmarks, profiler, plots) nor the integrations."""
    graph, _ = _imports()
    seen, todo = set(), ["tessera"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not [m for m in seen if m.startswith(("tessera.tools", "tessera.integrations"))]


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The walker itself: a planted cycle and an upward import are found."""
    pkg = tmp_path / "tessera"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .api import x\n")
    (pkg / "api.py").write_text("from .cuda import device\nx = 1\n")
    (pkg / "cuda" / "__init__.py").write_text("")
    (pkg / "cuda" / "device.py").write_text("from ..api import x\n"
                                            "def f():\n    import torch\n    from .. import api\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match="tessera.cuda.device .* imports tessera.api"):
        test_imports_point_down_the_layers()
    with pytest.raises(AssertionError, match=r"tessera.cuda.device:4 imports \. inside"):
        test_in_function_imports_are_optional_dependencies_only()


def test_runtime_functions_read_in_one_screen():
    """No function of the planning runtime (tessera/runtime/) is longer than 80 lines: the
    pipeline reads select -> map -> organize -> plan, each step a function of its own."""
    long = []
    for path in sorted((PACKAGE / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} "
                                f"({lines} lines)")
    assert not long, long
