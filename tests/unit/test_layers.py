"""The package's layers point down only, and the laptop's entry points stay light.

Each module gets a rank from the room it lives in; an import may go to the same rank or lower, never
higher, and no set of modules may import each other in a circle. The rooms and their order are drawn
in docs/architecture.md. Imports inside functions count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "autoslm"

# Longest matching prefix wins. Lower ranks may not import higher ones.
RANKS = {
    "autoslm.errors": 0,
    "autoslm.version": 0,
    "autoslm._image": 0,  # worker_image/boot.py and boot_rules.py: the standard library only (it runs before autoslm is installed)
    "autoslm.secrets": 1,
    "autoslm.layout": 1,
    "autoslm.procs": 1,
    "autoslm.recipes": 1,  # the rules a run follows: batching, the evaluation's shape, how GRPO generates
    "autoslm.catalog": 2,  # models and GPUs: prices and fits the recipes' rules, so above them
    "autoslm.envs": 3,  # the tasks and data formats: foundation that the JobSpec checks ids against
    "autoslm.spec": 4,
    "autoslm.sweep": 4,  # a sweep: a JobSpec and the grid of its points
    # What a vendor is, as data (the Vendor dataclass, the vendor table, each vendor's VENDOR and options):
    # the JobSpec's provider field, the secret names and the GPU ids read it, so it sits with the
    # foundation. Its runtime (provider, API client, its pod's own end) is autoslm/providers/<vendor>/.
    "autoslm.vendors": 1,
    "autoslm.store": 5,
    "autoslm.providers": 5,
    "autoslm.engine": 6,  # the pod side: foundation, envs, store, providers (it ends its own pod)
    "autoslm.controller": 7,
    "autoslm.sdk": 8,
    "autoslm.views": 9,
    "autoslm.cli": 9,
    "autoslm.__main__": 9,
    "autoslm": 9,  # the root: the public facade
}
# The laptop side runs a model in one place: `autoslm chat` (views/chat_model.py, imported only when a
# chat starts). Everything else that needs torch is the engine, started as a process (`autoslm export`'s
# merge and conversion: engine/export/, which sdk/export.py starts).
TRAINING_STACK = ("torch", "transformers", "peft", "trl", "vllm")
LAPTOP_MODEL_CODE = ("autoslm.views.chat_model",)
FOUNDATION = ("autoslm.spec", "autoslm.sweep", "autoslm.recipes", "autoslm.catalog", "autoslm.layout", "autoslm.errors")
LAPTOP_ONLY = ("autoslm.controller", "autoslm.sdk", "autoslm.views", "autoslm.cli")


def rank(module: str) -> int:
    parts = module.split(".")
    while parts:
        name = ".".join(parts)
        if name in RANKS:
            return RANKS[name]
        parts.pop()
    raise AssertionError(f"{module} is in no room: add it to RANKS and docs/architecture.md")


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(mods: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every autoslm import, resolved to the module it names."""

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        return ".".join(parts) or None

    edges = set()
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from autoslm import catalog` names the submodule, not the package
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                target = known(name) if name.startswith("autoslm") else None
                if target and target != mod:
                    edges.add((mod, target))
    return edges


MODS = modules()
EDGES = imports(MODS)


def upward(edges) -> list[str]:
    return sorted(f"{a} (rank {rank(a)}) imports {b} (rank {rank(b)})" for a, b in edges if rank(b) > rank(a))


def test_every_import_points_down():
    up = upward(EDGES)
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_recipes_never_import_the_catalog(tmp_path):
    """catalog prices and fits the recipes' rules: recipes -> catalog is an upward import, caught even
    inside a function."""
    assert rank("autoslm.catalog.fit") > rank("autoslm.recipes.generation")
    fake = {
        "autoslm.recipes.generation": tmp_path / "generation.py",
        "autoslm.catalog.fit": tmp_path / "fit.py",
        "autoslm.catalog": tmp_path / "__init__.py",
    }
    fake["autoslm.recipes.generation"].write_text("def f():\n    from autoslm.catalog import fit_report\n")
    fake["autoslm.catalog.fit"].write_text("from autoslm.recipes.generation import vllm_usable\n")
    fake["autoslm.catalog"].write_text("")
    found = imports(fake)
    assert found == {("autoslm.recipes.generation", "autoslm.catalog"), ("autoslm.catalog.fit", "autoslm.recipes.generation")}
    assert upward(found) == ["autoslm.recipes.generation (rank 1) imports autoslm.catalog (rank 2)"]


def test_no_import_circles():
    graph: dict[str, set[str]] = {m: set() for m in MODS}
    for a, b in EDGES:
        graph[a].add(b)
    # Tarjan's strongly connected components: any component of 2+ modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not circles, f"import circles: {circles}"


def test_foundation_never_reaches_above_itself():
    bad = sorted(
        f"{a} imports {b}" for a, b in EDGES if a.startswith(FOUNDATION) and b.startswith(LAPTOP_ONLY + ("autoslm.engine",))
    )
    assert not bad, "\n".join(bad)


def test_only_the_engine_imports_the_engine():
    """The laptop side never reaches into the worker (it starts it as a process instead)."""
    bad = sorted(f"{a} imports {b}" for a, b in EDGES if b.startswith("autoslm.engine") and not a.startswith("autoslm.engine"))
    assert not bad, "\n".join(bad)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check itself can fail: a foundation module importing the SDK is caught."""
    assert rank("autoslm.sdk") > rank("autoslm.spec")
    fake = {"autoslm.spec": tmp_path / "spec.py", "autoslm.sdk": tmp_path / "sdk.py"}
    fake["autoslm.spec"].write_text("def f():\n    from autoslm.sdk import Client\n")
    fake["autoslm.sdk"].write_text("from autoslm import spec\n")
    assert imports(fake) == {("autoslm.spec", "autoslm.sdk"), ("autoslm.sdk", "autoslm.spec")}


def vendor_data_reaching_the_runtime(edges) -> list[str]:
    """Imports from a vendor's data (autoslm/vendors/) into any provider runtime (autoslm/providers/):
    the data is foundation, and names its runtime by strings (``Vendor.provider_class``), never an import."""
    return sorted(f"{a} imports {b}" for a, b in edges if a.startswith("autoslm.vendors") and b.startswith("autoslm.providers"))


def test_vendor_data_never_imports_the_runtime():
    assert not vendor_data_reaching_the_runtime(EDGES)
    assert all(rank(m) < rank("autoslm.providers") for m in MODS if m.startswith("autoslm.vendors"))


def test_the_layer_check_sees_vendor_data_importing_its_runtime(tmp_path):
    """A vendor's data that imports its own client (even lazily) is an upward import, caught twice."""
    fake = {
        "autoslm.vendors.runpod": tmp_path / "data.py",
        "autoslm.providers.runpod.client": tmp_path / "client.py",
        "autoslm.providers.runpod": tmp_path / "runtime.py",
    }
    fake["autoslm.vendors.runpod"].write_text("def f():\n    from autoslm.providers.runpod.client import RunPodApi\n")
    fake["autoslm.providers.runpod.client"].write_text("from autoslm.vendors.runpod import KEY_ENV\n")
    fake["autoslm.providers.runpod"].write_text("")
    found = imports(fake)
    assert upward(found) == ["autoslm.vendors.runpod (rank 1) imports autoslm.providers.runpod.client (rank 5)"]
    assert vendor_data_reaching_the_runtime(found) == ["autoslm.vendors.runpod imports autoslm.providers.runpod.client"]


def stack_imports(path: Path) -> set[str]:
    """The training-stack packages a module imports, at any depth (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        )
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in TRAINING_STACK}
    return found


def test_only_the_engine_and_chats_model_code_import_the_training_stack():
    bad = sorted(
        f"{m} imports {', '.join(sorted(stack_imports(p)))}"
        for m, p in MODS.items()
        if not m.startswith("autoslm.engine") and m not in LAPTOP_MODEL_CODE and stack_imports(p)
    )
    assert not bad, "\n".join(bad)
    assert stack_imports(MODS["autoslm.views.chat_model"]) >= {"torch", "transformers", "peft"}
    # views/chat.py reaches it only inside the function that starts a chat: never at import time.
    top = [n for n in ast.parse(MODS["autoslm.views.chat"].read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("chat_model" in (getattr(n, "module", "") or "") for n in top)


def test_cli_imports_nothing_heavy():
    """`autoslm --help` and `autoslm status` stay fast: the CLI's modules load no training stack."""
    code = (
        "import sys, autoslm.cli, autoslm.views.commands, autoslm.views.watch, autoslm.views.chat, autoslm.views.plan, autoslm.sdk, "
        "autoslm.views.export, autoslm.sdk.export; "
        "print(','.join(m for m in ('torch', 'transformers', 'trl', 'pandas', 'datasets', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def test_no_file_in_the_package_is_past_500_lines():
    """A room that grows past this holds more than one job: split it by job (the registry's package,
    worker_image/boot.py and boot_rules.py)."""
    long = sorted(
        f"{p.relative_to(ROOT)}: {n} lines" for p in MODS.values() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    )
    assert not long, "\n".join(long)


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """Functions past MAX_FUNCTION_LINES whose first lines (the signature and docstring, or a comment
    just above the body) do not say why it is one piece: a ``why this is long:`` note."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
            head = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno + 1])
            if "why this is long:" not in head.lower():
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    return out


def test_no_function_is_past_80_lines_without_saying_why():
    long = sorted(line for p in MODS.values() for line in long_functions(p))
    assert not long, "split these by step, or say why each is one piece (a 'why this is long:' note):\n" + "\n".join(long)


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "a.py").write_text(f"def f():\n{body}")
    (tmp_path / "b.py").write_text(f"def f():\n    # why this is long: one table\n{body}")
    assert long_functions(tmp_path / "a.py", tmp_path) == [f"a.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
    assert long_functions(tmp_path / "b.py", tmp_path) == []


def test_one_function_decides_whether_vllm_may_sleep():
    """validate, plan, the planner and the pod ask ``recipes.generation.sleep_allowed``; none decides it again."""
    defined = sorted(
        m
        for m, p in MODS.items()
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name == "sleep_allowed"
    )
    assert defined == ["autoslm.recipes.generation"], defined
    again = sorted(
        m
        for m, p in MODS.items()
        if m != "autoslm.recipes.generation"
        and any(
            isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and "dynamic_sampling" in ast.unparse(n)
            for n in ast.walk(ast.parse(p.read_text()))
        )
    )
    assert not again, f"decides sleep mode itself: {again}"
    callers = {m for m, p in MODS.items() if "sleep_allowed(" in p.read_text()}
    assert {"autoslm.cli", "autoslm.spec.checks", "autoslm.controller.placement", "autoslm.engine.train.gpu"} <= callers
