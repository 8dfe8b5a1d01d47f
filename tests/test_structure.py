"""The package structure: layers, no import cycles, no private names across packages, lazy Numba.

These guard properties a reader relies on (docs/architecture.md draws them): every module can be
imported on its own, dependencies point one way, down the floors of :data:`LAYERS`, the package
root holds public modules only, no module is a shim that re-exports another, and
``import collectives`` stays fast.
"""

import ast
import subprocess
import re
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGES = ("compress", "collectives")
#: The floors of the library, lowest first, one row per folder (and per module of the package
#: root): a module imports only modules of its own floor or of floors below it. A folder's row
#: holds everything in it; ``collectives`` is the package's ``__init__`` alone (its re-exports),
#: so a module at the root that is not listed here is on no floor and fails the test.
LAYERS = (
    ("compress",),
    # the root's leaf modules, used by every floor (observe: ops.Op.combine reads it too)
    ("collectives.options", "collectives.ops", "collectives.observe"),
    ("collectives._runtime",),
    ("collectives.selection",),
    ("collectives.blocks",),
    ("collectives.algorithms",),
    ("collectives.compressed",),
    ("collectives.api",),
    ("collectives.pt2pt", "collectives.mesh"),
    ("collectives.decentralized",),
    ("collectives.engine",),
    ("collectives.parallel",),
    ("collectives.diagnostics",),
    ("collectives.tools",),
    ("collectives",),
    ("collectives.sgd",),
    # the planner's command: it reads the SGD driver's models, data sets and parser
    ("collectives.plan",),
    ("collectives.torch",),
    ("collectives.__main__",),
)
#: The modules of the package root: ``__init__`` (re-exports), ``__main__``, the public blocking
#: collectives and the leaves every floor uses; everything else lives in the folder of its floor.
ROOT_MODULES = {"__init__.py", "__main__.py", "api.py", "options.py", "ops.py", "observe.py"}

# Imports every module of both packages in one fresh interpreter, watching every import statement:
# it is a cycle when a module is imported while it is still being executed by its own import, from
# anywhere but its own submodules. A package's submodules may import their siblings through it
# (``from .. import tuning``) but not read its attributes before it is finished. (Passing through a
# package that is still initialising, to one of its submodules, is no cycle: Python imports the
# submodule on its own.)
_CYCLES = textwrap.dedent(r'''
    import builtins, importlib, importlib.util, pkgutil, sys, warnings
    warnings.simplefilter("ignore")
    OURS = {PACKAGES!r}
    problems = []
    real_import = builtins.__import__

    def initializing(name):
        spec = getattr(sys.modules.get(name), "__spec__", None)
        return bool(getattr(spec, "_initializing", False))

    def is_module(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {{}}).get("__name__", "")
        if level:
            package = globals.get("__package__") or importer.rpartition(".")[0]
            target = importlib.util.resolve_name("." * level + name, package)
        else:
            target = name
        # (pkgutil imports with no importer)
        if importer and target.split(".")[0] in OURS and target != importer and initializing(target):
            if not importer.startswith(target + "."):
                problems.append(f"{{importer}} imports {{target}} while {{target}} is being imported")
            else:
                for item in fromlist or ():
                    if item != "*" and not is_module(f"{{target}}.{{item}}"):
                        problems.append(f"{{importer}} reads {{target}}.{{item}} before {{target}} "
                                        "is initialised")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = hook
    names = []
    for top in OURS:
        pkg = importlib.import_module(top)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, top + ".")]
    for name in names:
        if name.endswith("__main__") or ".cuda" in name:
            continue  # __main__ runs the program; CUDA kernels need a device or the simulator
        importlib.import_module(name)
    print(len(names))
    print("\n".join(problems))
''')


def test_no_module_is_imported_during_its_own_import():
    out = subprocess.run([sys.executable, "-c", _CYCLES.format(PACKAGES=PACKAGES)],
                         capture_output=True, text=True, timeout=120, cwd=SRC)
    assert out.returncode == 0, out.stderr
    count, *problems = out.stdout.splitlines()
    assert int(count) > 80, out.stdout  # it did walk both packages
    assert not [p for p in problems if p], "\n".join(problems)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (at import time or inside functions), from the source:
    ``from X import a`` is an edge to ``X.a`` where that is a module, else to ``X``."""
    modules = {module: (path, is_pkg) for path, module, is_pkg in _modules()}
    graph: dict[str, set[str]] = {}
    for module, (path, is_pkg) in modules.items():
        package = module if is_pkg else module.rpartition(".")[0]
        edges = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    edges.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
        edges &= set(modules)
        edges.discard(module)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a list of modules, first = last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_import_graph_has_no_cycles():
    """Counting imports inside functions too: a function-level import does not make a cycle go
    away, it only postpones it (the old ``algorithms -> auto -> tuning -> algorithms``)."""
    cycle = _cycle(_import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield path, ".".join(parts), rel.name == "__init__"


def _private_imports(path: Path, module: str, is_package: bool) -> list[str]:
    """Private modules of other packages, and private names of modules outside the importer's own
    package, that ``module`` imports."""
    package = module if is_package else module.rpartition(".")[0]
    ancestors = {".".join(package.split(".")[:k]) for k in range(1, package.count(".") + 2)}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [(a.name, target) for a in node.names]
        elif isinstance(node, ast.Import):
            target, names = None, []
            for a in node.names:
                names.append((None, a.name))
        else:
            continue
        for name, mod in names:
            parts = mod.split(".")
            if parts[0] not in PACKAGES:
                continue
            for k, part in enumerate(parts):
                if part.startswith("_") and ".".join(parts[:k]) not in ancestors:
                    found.append(f"{module}: private module {mod}")
            if name and name.startswith("_") and not name.startswith("__"):
                sub = SRC.joinpath(*parts, name)
                is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                own = mod == package or mod.rpartition(".")[0] == package or \
                    (is_module and mod in ancestors)  # a private module of an ancestor
                if not own:
                    found.append(f"{module}: private name {mod}.{name}")
    return found


def test_no_private_names_across_packages():
    found = [f for path, module, is_pkg in _modules() for f in _private_imports(path, module, is_pkg)]
    assert not found, "\n".join(found)


#: The experiment scripts of ``bench/`` allowed to reach a private internal directly: none. They
#: use public names and documented modules (``collectives.diagnostics.probe`` where a measurement
#: needs a communicator's context or a remembered call; bench/call_lines.py leaves the algorithm
#: out of its trace by the folder of its code).
BENCH_INTERNALS: set[str] = set()


def _bench_private(path: Path) -> list[str]:
    """The private modules and names of our packages that a script of ``bench/`` imports or
    reads (``module._name``)."""
    found = []
    tree = ast.parse(path.read_text())
    modules = set()  # the names the script binds to our packages' modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names
                        if a.name.split(".")[0] in PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in PACKAGES:
            modules |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in modules and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in PACKAGES:
            parts = node.module.split(".")
            found += [node.module for part in parts if part.startswith("_")][:1]
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in PACKAGES
                      and any(part.startswith("_") for part in a.name.split("."))]
    return found


def test_bench_scripts_use_public_names():
    bench = SRC.parent / "bench"
    found = {path.name: _bench_private(path) for path in sorted(bench.glob("*.py"))}
    offenders = {name: names for name, names in found.items()
                 if names and name not in BENCH_INTERNALS}
    assert not offenders, offenders
    assert {name for name, names in found.items() if names} == BENCH_INTERNALS, \
        "a script of BENCH_INTERNALS no longer needs a private name: take it off the list"
    assert not list(bench.glob("osu_*.py")), "the installed osu_* commands need no wrapper here"


def test_private_import_check_can_fail(tmp_path):
    """The check above sees the three kinds of import the issue named."""
    bad = tmp_path / "m.py"
    bad.write_text("from ..api import _pick\nfrom compress._backends.cuda import host_copy\n"
                   "from ..algorithms._fold import pof2_of\n")
    found = _private_imports(bad, "collectives.compressed.m", False)
    assert len(found) == 3, found


def test_compress_never_imports_mpi_or_collectives():
    for path in sorted((SRC / "compress").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            assert not [n for n in names if n.split(".")[0] in ("mpi4py", "collectives")], path


def test_strategies_dispatch_on_protocols_not_hasattr():
    for path in sorted((SRC / "collectives" / "compressed").glob("*.py")):
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("hasattr", "getattr")]
        assert not calls, f"{path.name} probes attributes (line {calls[0].lineno}): use " \
                          "compress.protocols"


@pytest.mark.parametrize("module", ["collectives", "compress"])
def test_import_does_not_import_numba(module):
    """Numba is imported when a kernel first runs, not with the package (bench/import_time.py)."""
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('numba', 'llvmlite')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_first_kernel_imports_numba():
    """... and is there once a codec runs (the lazy import really happens)."""
    code = ("import sys, numpy as np, compress; compress.get('topk').encode(np.ones(8, np.float32));"
            " print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def _floor(module: str) -> int:
    best, floor = -1, None
    for k, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "collectives"
            if (module == prefix or inside) and len(prefix) > best:
                best, floor = len(prefix), k
    assert floor is not None, f"{module} is on no floor of LAYERS"
    return floor


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} (floor {_floor(m)}) imports {t} (floor {_floor(t)})"
                  for m, targets in graph.items() for t in targets if _floor(t) > _floor(m))


def test_imports_point_down_the_layers():
    """No module of a lower floor imports a higher one, counting imports inside functions:
    algorithms, blocks, the runtime and ops never import the tuning tools, the benchmarks, the
    SGD driver or the PyTorch integration; the selection layer never imports an algorithm."""
    found = _upward(_import_graph())
    assert not found, "\n".join(found)


def test_every_module_is_on_a_floor():
    """The root is not a catch-all: a module outside the floors' folders and the root's listed
    modules is on no floor."""
    for _, module, _ in _modules():
        _floor(module)
    with pytest.raises(AssertionError, match="on no floor"):
        _floor("collectives.loose")


def test_package_root_holds_the_listed_modules_only():
    root = SRC / "collectives"
    loose = sorted(p.name for p in root.iterdir() if p.suffix == ".py")
    assert set(loose) == ROOT_MODULES, f"modules at the package root: {loose} (each belongs in " \
        "the folder of its floor, tests/test_structure.py LAYERS)"
    folders = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    rows = {prefix.split(".")[1] for row in LAYERS for prefix in row if prefix.count(".") == 1}
    assert folders <= rows, f"folders without a row in LAYERS: {sorted(folders - rows)}"


def test_old_public_paths_still_import():
    """``collectives.topology``, ``.timeline`` and ``.flight_recorder`` moved into their floors'
    folders; users' imports of the short paths keep working, as the same module objects."""
    code = ("import collectives, collectives.topology as t; from collectives.timeline import span; "
            "from collectives.flight_recorder import dump; "
            "import collectives.decentralized.topology as d, collectives.diagnostics.timeline as tl; "
            "print(t is d, span is tl.span, collectives.topology is d)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True"] * 3, out.stderr


def test_layer_check_can_fail():
    graph = {"collectives.algorithms.auto": {"collectives.tools.tuning.tune"},
             "collectives._runtime.guard": {"collectives.options"},
             "collectives.selection.tuning_file": {"collectives.algorithms.flat"}}
    assert len(_upward(graph)) == 2, _upward(graph)


def _is_shim(path: Path) -> bool:
    """A module that re-exports another (``from X import *``) or warns that it moved."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and "DeprecationWarning" in ast.dump(call):
            return True
    return False


def test_no_shim_modules():
    shims = [str(path.relative_to(SRC)) for path, _, _ in _modules() if _is_shim(path)]
    assert not shims, shims


def test_shim_check_can_fail(tmp_path):
    shim = tmp_path / "model.py"
    shim.write_text("import warnings\nfrom .tuning.cost_model import *  # noqa\n"
                    "warnings.warn('moved', DeprecationWarning)\n")
    assert _is_shim(shim)


def test_selection_names_are_the_catalogues():
    """The selection layer names the algorithms without importing them; the names agree."""
    from collectives.algorithms import ALGORITHMS, FLAT
    from collectives.selection import FLAT_NAMES, TUNABLE

    assert set(FLAT_NAMES) == set(FLAT)
    assert set(TUNABLE) == set(ALGORITHMS) - {"auto"}


#: Modules that call ``setattr`` on objects other than ``self``, and why that patches nothing:
#: each names attributes of its own records by a variable.
SETATTR_ALLOWED = {
    "collectives/_runtime/comm_state.py": "the fields of its own Slots record, named by a variable",
    "collectives/sgd/timing.py": "instance attributes of the driver's own codec objects (a "
                                 "stopwatch per method of this run's instances; no class or "
                                 "module changes)",
    "collectives/torch/fully_shard.py": "the user's module handed to fully_shard: its unit's "
                                        "record, and views of the gathered parameters where "
                                        "the original ones were, as FSDP2 does (instance "
                                        "attributes; no class or module changes)",
}


def _patches(tree: ast.AST) -> list[str]:
    """Where a module changes attributes of the library's other modules or classes at run
    time: a ``setattr``/``delattr`` (also ``object.__setattr__``) on anything but ``self``, or
    an assignment (plain, augmented, annotated; through a subscript too: ``mod.HOOK[0] = f``)
    or deletion whose target hangs off a name imported from the library."""
    ours = set()  # names bound by imports of the library (relative, collectives, compress)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").split(".")[0] in PACKAGES):
            ours.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            ours.update((a.asname or a.name).split(".")[0] for a in node.names
                        if a.name.split(".")[0] in PACKAGES)
    found = []

    def check(target: ast.AST, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                check(t, line)
            return
        base = target
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            base = base.value
        if base is not target and isinstance(base, ast.Name) and base.id in ours:
            found.append(f"line {line}: assigns {ast.unparse(target)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            builtin = isinstance(func, ast.Name) and func.id in ("setattr", "delattr")
            dunder = isinstance(func, ast.Attribute) and func.attr in ("__setattr__",
                                                                       "__delattr__")
            first = node.args[0]
            if (builtin or dunder) and not (isinstance(first, ast.Name) and first.id == "self"):
                found.append(f"line {node.lineno}: {ast.unparse(node)[:70]}")
        elif isinstance(node, (ast.Assign, ast.Delete)):
            for t in node.targets:
                check(t, node.lineno)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            check(node.target, node.lineno)
    return found


def test_no_module_patches_another_at_run_time():
    """Observers, not patches (STYLE 19): the timeline, the schedule trace and the flight
    recorder register on the observation points of ``observe.py``; no module of the
    library wraps or replaces an attribute of another module or class, or fills a hook slot
    kept in one (``mod.HOOK[0] = f``)."""
    found = []
    for path in sorted((SRC / "collectives").rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel in SETATTR_ALLOWED:
            continue
        found += [f"{rel}: {f}" for f in _patches(ast.parse(path.read_text()))]
    assert not found, "\n".join(found)


def test_patch_check_can_fail():
    """The check above sees each way the timeline, the schedule trace and the flight recorder
    used to patch the library, and lets a module's own state, an instance's attributes and
    the environment be."""
    bad = ast.parse(textwrap.dedent("""
        from .. import ops
        from .._runtime import flight, validate as _validate
        from .._runtime.shmem.team import Team
        import collectives.engine.nonblocking
        for owner, attr, wrapper in points:
            setattr(owner, attr, wrapper)
        Team.run, Team.run_compiled = a, b
        flight.SPANS[0] = f
        _validate.TIMELINE_START[0] = g
        flight.DUMPER[:] = [g]
        ops.RECORDER[0] += 1
        del Team.run
        collectives.engine.nonblocking._submit = h
    """))
    assert len(_patches(bad)) == 9, _patches(bad)
    good = ast.parse(textwrap.dedent("""
        import os
        from mpi4py import MPI
        from .observe import register
        _STATE = [None]
        _STATE[0] = 1
        os.environ["X"] = "1"
        self.x = 1
        setattr(self, "x", 1)
        object.__setattr__(self, "timeline", path)
        obj.attr = 2
        register("call", f)
    """))
    assert _patches(good) == [], _patches(good)


def test_no_audit_hook_and_one_repeat_cache():
    """The library installs no audit hook (it would be a Python call on every audited event of
    the whole process, ``id()`` included), and remembers repeated calls in one cache: only
    ``_runtime/repeats.py`` defines one (the blocking and non-blocking forms subclass its
    entry)."""
    texts = {p.relative_to(SRC).as_posix(): p.read_text() for p in SRC.rglob("*.py")}
    assert not [name for name, text in texts.items() if "addaudithook" in text]
    caches = sorted(name for name, text in texts.items()
                    if re.search(r"^class \w*Repeats\b|^REPEATS = ", text, re.M))
    assert caches == ["collectives/_runtime/repeats.py"], caches
