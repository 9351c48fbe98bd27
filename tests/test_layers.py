"""The layer rule: a package never imports one above it (see CONTRIBUTING.md)."""

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "headrace"
LAYER_RANK = {
    "errors": 0,
    "protocol": 1,
    "storage": 2,
    "coordinator": 2,
    "broker": 3,
    "client": 4,
    "spark": 4,
    "cli": 5,
    "faults": 6,
}
FORBIDDEN_SIDEWAYS = {("storage", "coordinator"), ("coordinator", "storage")}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "headrace" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYER_RANK else None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _source_files():
    return sorted(p for p in PACKAGE_ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_module_imports_only_lower_layers(path):
    relative = path.relative_to(PACKAGE_ROOT)
    own_layer = relative.parts[0].removesuffix(".py") if relative.parts else None
    if own_layer not in LAYER_RANK:
        return
    for imported in _imports(path):
        target = _layer_of(imported)
        if target is None or target == own_layer:
            continue
        assert LAYER_RANK[target] < LAYER_RANK[own_layer] or (
            LAYER_RANK[target] == LAYER_RANK[own_layer] and target in ("client", "spark")
        ), f"{relative} (layer {own_layer}) imports {imported} (layer {target})"
        assert (own_layer, target) not in FORBIDDEN_SIDEWAYS, f"{relative} imports {imported}"


def test_every_module_has_a_docstring():
    missing = [
        str(p.relative_to(PACKAGE_ROOT))
        for p in _source_files()
        if p.name != "__init__.py" and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"modules without a docstring: {missing}"


def test_the_rule_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import headrace.broker.server\nfrom headrace.cli import main\n")
    layers = [_layer_of(name) for name in _imports(bad)]
    assert layers == ["broker", "cli"]
    assert all(LAYER_RANK[layer] > LAYER_RANK["storage"] for layer in layers)
