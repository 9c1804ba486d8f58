"""The shape of the tree (docs/design.md): imports go one way, with no cycle, lazy imports
included; kformer/ itself holds few modules; the README stays a page for users."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ("kformer.data", "kformer.model", "kformer.train", "kformer.decode")


def _modules():
    """{dotted name: path} of kformer/ and export/ (installed as kformer.export)."""
    found = {}
    for folder, package in (("kformer", "kformer"), ("export", "kformer.export")):
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _imports(name, path, modules):
    """The modules `name` imports anywhere in its file (a function's lazy imports included), each
    with the packages a Python import runs first (but its own)."""
    is_package = path.name == "__init__.py"
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - (0 if is_package else 1) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            named.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    found = set()
    for dotted in named:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            inside = name.startswith(prefix + ".") and i < len(parts)  # a package of its own
            if prefix in modules and prefix != name and not inside:
                found.add(prefix)
    return found


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_lazy_imports_included():
    assert _cycles(_graph()) == []


def test_imports_go_one_way():
    """The pipeline's stages never import export, serve, bench or the CLI; export never imports
    serve, bench or the CLI; nothing imports the CLI but its own modules; kformer.contracts imports
    no other part of kformer."""
    graph = _graph()
    upward = {
        (name, imported)
        for name, imports in graph.items()
        for imported in imports
        if (
            name.startswith(CORE)
            and imported.startswith(("kformer.export", "kformer.serve", "kformer.bench"))
        )
        or (name.startswith("kformer.export") and imported.startswith(("kformer.serve", "kformer.bench")))
        or (name.startswith("kformer.contracts") and not imported.startswith("kformer.contracts"))
        or (imported.startswith("kformer.cli") and not name.startswith("kformer.cli"))
    }
    assert upward == set()


def test_the_checks_see_lazy_imports_and_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = "def f():\n    from kformer.serve import app\n"
    assert "kformer.serve.app" in _imports_of_source(lazy, _modules())


def _imports_of_source(source, modules):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "m.py"
        path.write_text(source)
        return _imports("kformer.model.m", path, modules)


def test_kformer_holds_its_stages_and_few_modules():
    top = sorted(p.stem for p in (ROOT / "kformer").glob("*.py") if p.stem != "__init__")
    stages = sorted(p.name for p in (ROOT / "kformer").iterdir() if (p / "__init__.py").exists())
    assert len(top) <= 12, top
    assert {"data", "model", "train", "decode", "serve", "bench"} <= set(stages)


def test_the_readme_is_a_page_for_users():
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 250
    assert len([line for line in readme if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]) <= 3
    for link in re.findall(r"\]\((docs/[^)#]+)", "\n".join(readme)):
        assert (ROOT / link).exists(), link


def test_every_package_is_installed():
    """pyproject.toml lists its packages by hand (export/ installs as kformer.export): each folder
    of modules must be there, or a plain `pip install .` leaves it out."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()
    folders = {name: ROOT / name.replace("kformer.export", "export").replace(".", "/") for name in listed}
    assert [name for name, folder in folders.items() if not folder.is_dir()] == []  # e.g. export/web: data


def test_the_readmes_python_imports_work():
    """The README's Python API (`from kformer.train import train`, open_runner) imports as shown."""
    readme = (ROOT / "README.md").read_text()
    imports = re.findall(r"^from kformer[\w.]* import \w+$", readme, flags=re.M)
    assert imports
    for line in imports:
        exec(line, {})


MAX_LINES, MAX_PARAMETERS = 60, 8  # a function reads at once; past ~8 parameters, pass a dataclass


def _functions():
    """(where, own lines, parameters) of every function in kformer/ and export/: its lines
    without those of the functions and classes nested in it, its parameters without self/cls."""
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{name}.{node.name}:{node.lineno}", _own_lines(node), _parameters(node)


def _own_lines(function):
    nested = set()
    for node in ast.walk(function):
        if node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            nested.update(range(node.lineno, node.end_lineno + 1))
    return len(set(range(function.lineno, function.end_lineno + 1)) - nested)


def _parameters(function):
    a = function.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [
        p.arg for p in (a.vararg, a.kwarg) if p
    ]
    return len(names) - (names[:1] in (["self"], ["cls"]))


def test_no_function_is_longer_than_a_screen_or_takes_too_many_parameters():
    long = [(where, lines) for where, lines, _ in _functions() if lines > MAX_LINES]
    wide = [(where, count) for where, _, count in _functions() if count > MAX_PARAMETERS]
    assert long == [] and wide == []


def test_every_module_is_named_in_the_design_document():
    """docs/design.md names each module by its file name (`name.py`) or, for a package, its folder."""
    design = (ROOT / "docs" / "design.md").read_text()
    missing = [
        name
        for name, path in _modules().items()
        if not re.search(
            rf"\b{re.escape(path.name if path.name != '__init__.py' else path.parent.name)}\b", design
        )
    ]
    assert missing == []


def _object_fields():
    """Fields typed `object` of the dataclasses and NamedTuples of kformer/ and export/: a type
    that says nothing of what the field holds."""
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and "object" in ast.unparse(item.annotation).split(
                        " | "
                    ):
                        yield f"{name}.{node.name}.{ast.unparse(item.target)}"


def test_no_field_is_typed_object():
    assert list(_object_fields()) == []


def test_the_limit_checks_see_what_they_guard(tmp_path, monkeypatch):
    source = (
        "class A:\n    x: object\n    y: int | object\n\n\ndef f(a, b, c, d, e, f, g, h, i):\n"
        + "    pass\n" * 61
    )
    (tmp_path / "kformer").mkdir()
    (tmp_path / "kformer" / "m.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    (tmp_path / "export").mkdir()
    assert sorted(_object_fields()) == ["kformer.m.A.x", "kformer.m.A.y"]
    assert [(lines, count) for _, lines, count in _functions()] == [(62, 9)]
