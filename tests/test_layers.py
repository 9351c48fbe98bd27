"""The layer rule: a package never imports one above it (see CONTRIBUTING.md).

It covers the Python and the C of every package under headrace/:

* Python imports in every form a module can name another: ``import headrace.x``,
  ``from headrace.x import y``, ``from headrace import x``, relative imports
  (``from ..broker import server``, resolved against the module's own package), and
  ``importlib.import_module`` / ``__import__`` called with a string literal;
* C: each ``#include "..."`` of a project header (resolved as the compiler does, from the
  including file's directory) and each module a C file imports by name
  (``PyImport_ImportModule("headrace...")``, ``PyCapsule_Import``) -- a C file belongs to
  the package of its directory, a header too;
* the compiled extensions: each ``.c`` under headrace/ is built by exactly one Extension of
  setup.py, named in the package of its source, and an extension module is imported only by
  its own package's Python (``headrace.storage._segment_io`` by ``headrace/storage/*.py``).

``layer_violations(path, package_root)`` is the rule; the tests run it over the tree, and the
self-tests run it over bad modules written to a temporary package.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "headrace"
SETUP_PY = PACKAGE_ROOT.parent / "setup.py"
LAYER_RANK = {
    "errors": 0,
    "protocol": 1,
    "storage": 2,
    "coordinator": 2,
    "cluster": 3,
    "broker": 4,
    "client": 5,
    "spark": 5,
    "cli": 6,
    "faults": 7,
}
PEERS_THAT_MAY_IMPORT_EACH_OTHER = ("client", "spark")
FORBIDDEN_SIDEWAYS = {("storage", "coordinator"), ("coordinator", "storage")}
SOURCE_SUFFIXES = (".py", ".c", ".h")
IMPORT_FUNCTIONS = ("import_module", "__import__")
C_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
C_MODULE_IMPORT = re.compile(r'\b(?:PyImport_ImportModule|PyCapsule_Import)\s*\(\s*"([^"]+)"')


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "headrace" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYER_RANK else None


def _own_layer(path: Path, package_root: Path) -> str | None:
    relative = path.relative_to(package_root)
    layer = relative.parts[0].removesuffix(".py")
    return layer if layer in LAYER_RANK else None


def _may_import(own_layer: str, target_layer: str) -> bool:
    if target_layer == own_layer:
        return True
    if (own_layer, target_layer) in FORBIDDEN_SIDEWAYS:
        return False
    if LAYER_RANK[target_layer] == LAYER_RANK[own_layer]:
        return target_layer in PEERS_THAT_MAY_IMPORT_EACH_OTHER
    return LAYER_RANK[target_layer] < LAYER_RANK[own_layer]


def _package_of(path: Path, package_root: Path) -> list[str]:
    """The dotted package a module of ``path`` belongs to: ``["headrace", "storage"]``."""
    return [package_root.name, *path.relative_to(package_root).parent.parts]


def _resolve_relative(package: list[str], level: int, module: str | None) -> str:
    base = package[:len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, *([module] if module else [])])


def _string_argument(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def python_imports(path: Path, package_root: Path) -> list[str]:
    """Every module ``path`` names for import, as an absolute dotted name (``from a import b``
    names both ``a`` and ``a.b``: ``b`` may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path, package_root)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "") if node.level == 0 else _resolve_relative(
                package, node.level, node.module)
            names.append(module)
            names.extend(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and _called_name(node) in IMPORT_FUNCTIONS:
            target = _string_argument(node)
            if target is not None:
                names.append(_resolve_relative(package, len(target) - len(target.lstrip(".")),
                                               target.lstrip(".") or None)
                             if target.startswith(".") else target)
    return [name for name in names if name]


def c_dependencies(path: Path, package_root: Path) -> list[tuple[str, str | None]]:
    """(what, its layer) for each project header ``path`` includes (resolved from its
    directory; a header outside headrace/ has no layer) and each module it imports by name."""
    text = path.read_text()
    found: list[tuple[str, str | None]] = []
    for header in C_INCLUDE.findall(text):
        resolved = (path.parent / header).resolve()
        inside = resolved.is_relative_to(package_root.resolve()) and resolved.exists()
        layer = _own_layer(resolved, package_root.resolve()) if inside else None
        found.append((f'#include "{header}"', layer))
    for module in C_MODULE_IMPORT.findall(text):
        found.append((f'imports "{module}"', _layer_of(module) or "?"))
    return found


# C sources that are not Python extensions, with the module that builds each: the power-cut
# LD_PRELOAD shim is compiled by the fault harness at run time (its includes are still checked).
NOT_EXTENSIONS = {"headrace/faults/power_cut_shim.c": "headrace/faults/power_cut.py",
                  "headrace/faults/source_address_shim.c": "headrace/faults/cluster.py"}


def extension_modules(package_root: Path) -> dict[str, str]:
    """Dotted name -> layer of each compiled extension: one per ``.c`` file under the root
    that is not in NOT_EXTENSIONS."""
    return {".".join(_package_of(c_file, package_root) + [c_file.stem]):
            _own_layer(c_file, package_root) for c_file in package_root.rglob("*.c")
            if str(c_file.relative_to(package_root.parent)) not in NOT_EXTENSIONS}


def _is_extension_import(module: str, extensions: dict[str, str]) -> str | None:
    for extension in extensions:
        if module == extension or module.startswith(extension + "."):
            return extension
    return None


def _python_violations(path: Path, package_root: Path, own_layer: str) -> list[str]:
    violations = []
    extensions = extension_modules(package_root)
    for imported in python_imports(path, package_root):
        target = _layer_of(imported)
        if target is not None and not _may_import(own_layer, target):
            violations.append(f"imports {imported} (layer {target})")
        extension = _is_extension_import(imported, extensions)
        if extension is not None and extensions[extension] != own_layer:
            violations.append(f"imports the {extensions[extension]} package's compiled "
                              f"extension {extension}: only its own package's Python may")
    return violations


def _c_violations(path: Path, package_root: Path, own_layer: str) -> list[str]:
    violations = []
    for what, layer in c_dependencies(path, package_root):
        if layer is None and what.startswith("#include"):
            violations.append(f"{what}: not a header under headrace/")
        elif layer == "?":
            violations.append(f"{what}: not one of headrace's packages")
        elif layer is not None and not _may_import(own_layer, layer):
            violations.append(f"{what} (layer {layer})")
    return violations


def layer_violations(path: Path, package_root: Path = PACKAGE_ROOT) -> list[str]:
    """What ``path`` (a .py, .c or .h file under ``package_root``) imports or includes that
    its layer may not, one line each; empty when it keeps the rule."""
    own_layer = _own_layer(path, package_root)
    if own_layer is None:
        return []
    relative = path.relative_to(package_root)
    check = _python_violations if path.suffix == ".py" else _c_violations
    return [f"{relative} (layer {own_layer}) {v}" for v in check(path, package_root, own_layer)]


def _source_files(suffixes=SOURCE_SUFFIXES):
    return sorted(p for p in PACKAGE_ROOT.rglob("*") if p.suffix in suffixes)


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_module_imports_only_lower_layers(path):
    assert layer_violations(path) == []


def _setup_extensions() -> dict[str, list[str]]:
    """Extension name -> its sources, as setup.py declares them."""
    extensions = {}
    for node in ast.walk(ast.parse(SETUP_PY.read_text())):
        if isinstance(node, ast.Call) and _called_name(node) == "Extension":
            sources = next(k.value for k in node.keywords if k.arg == "sources")
            extensions[_string_argument(node)] = [ast.literal_eval(s) for s in sources.elts]
    return extensions


def test_each_c_file_is_built_as_an_extension_of_its_own_package():
    declared = _setup_extensions()
    built_from = {source: name for name, sources in declared.items() for source in sources}
    for c_file in _source_files((".c",)):
        source = str(c_file.relative_to(PACKAGE_ROOT.parent))
        if source in NOT_EXTENSIONS:
            builder = PACKAGE_ROOT.parent / NOT_EXTENSIONS[source]
            assert c_file.name in builder.read_text(), f"{builder} does not build {source}"
            continue
        assert source in built_from, f"{source} is built by no Extension in setup.py"
        name = built_from[source]
        assert name.rsplit(".", 1)[0] == ".".join(_package_of(c_file, PACKAGE_ROOT)), (
            f"{source} is built as {name}, outside its own package")
    assert set(declared) == set(extension_modules(PACKAGE_ROOT))


def test_every_module_has_a_docstring():
    missing = [
        str(p.relative_to(PACKAGE_ROOT))
        for p in _source_files((".py",))
        if p.name != "__init__.py" and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"


# ---------------------------------------------------------------- the rule's self-tests

BAD_MODULES = {
    "storage/absolute.py": "import headrace.broker.server\nfrom headrace.cli import main\n",
    "storage/relative.py": "from ..broker import server\n",
    "storage/relative_module.py": "from ..broker.server import serve\n",
    "storage/from_package.py": "from headrace import broker\n",
    "storage/import_module.py": 'import importlib\nimportlib.import_module("headrace.broker.x")\n',
    "storage/bare_import_module.py": 'from importlib import import_module\n'
                                     'import_module("headrace.cli")\n',
    "storage/dunder_import.py": '__import__("headrace.spark.sink")\n',
    "storage/sideways.py": "from headrace.coordinator import group\n",
    "storage/nested/deeper.py": "from ...broker import server\n",
    "spark/other_extension.py": "from headrace.storage import _segment_io\n",
    "spark/other_extension_dotted.py": "import headrace.storage._segment_io\n",
    "protocol/upward_include.c": '#include "../storage/cooperative_spans.h"\n',
    "protocol/upward_header.h": '#include "../broker/hint.h"\n',
    "protocol/missing_include.c": '#include "no_such_header.h"\n',
    "protocol/upward_c_import.c": 'PyImport_ImportModule("headrace.storage._segment_io");\n',
    "storage/upward_capsule.c": 'PyCapsule_Import("headrace.broker._scheduling.word", 0);\n',
}
GOOD_MODULES = {
    "broker/fine.py": "from ..storage import _log\nfrom headrace import protocol\n"
                      'import importlib\nimportlib.import_module("headrace.storage.log")\n'
                      "from . import sibling\nfrom headrace.storage.segment_io import x\n",
    "storage/own_extension.py": "from headrace.storage import _segment_io\nfrom . import _segment_io\n",
    "storage/includes_protocol.c": '#include "../protocol/kernel_common.h"\n#include <Python.h>\n'
                                   'PyImport_ImportModule("headrace.errors");\n',
    "broker/imports_storage.c": 'PyCapsule_Import("headrace.storage._segment_io.word", 0);\n'
                                '#include "../storage/cooperative_spans.h"\n',
}
# Files the bad and good modules name, so that includes resolve and extensions exist.
SUPPORT_FILES = ("storage/cooperative_spans.h", "broker/hint.h", "protocol/kernel_common.h",
                 "storage/_segment_io.c", "broker/_scheduling.c")


def _write_package(root: Path, modules: dict[str, str]) -> Path:
    package_root = root / "headrace"
    for name, text in {**{f: "" for f in SUPPORT_FILES}, **modules}.items():
        (package_root / name).parent.mkdir(parents=True, exist_ok=True)
        (package_root / name).write_text(text)
    return package_root


@pytest.mark.parametrize("name", sorted(BAD_MODULES))
def test_the_rule_refuses_a_bad_module(tmp_path, name):
    package_root = _write_package(tmp_path, BAD_MODULES)
    violations = layer_violations(package_root / name, package_root)
    assert violations, f"{name} passed the layer rule: {BAD_MODULES[name]!r}"


@pytest.mark.parametrize("name", sorted(GOOD_MODULES))
def test_the_rule_accepts_a_good_module(tmp_path, name):
    package_root = _write_package(tmp_path, GOOD_MODULES)
    assert layer_violations(package_root / name, package_root) == []
