"""The type stubs the wheel ships (``vramscope/_native.pyi`` and ``py.typed``) against the
native module they describe: every public function and class of ``vramscope._native`` is in
the stub, with each of its public methods and properties, and the stub names nothing the
module lacks, so a function added in Rust without its stub fails here."""

import ast
import inspect
import pathlib

import vramscope
from vramscope import _native

PACKAGE = pathlib.Path(vramscope.__file__).resolve().parent


def stub() -> ast.Module:
    return ast.parse((PACKAGE / "_native.pyi").read_text())


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_the_wheel_ships_the_stub_and_the_typed_marker():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_native.pyi").is_file()


def test_every_name_of_the_module_is_in_the_stub_and_no_other():
    tree = stub()
    stubbed = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    module = public(name for name in dir(_native)
                    if inspect.isclass(getattr(_native, name))
                    or callable(getattr(_native, name)))
    assert module - stubbed == set(), "in the module, not in the stub"
    assert public(stubbed) - module == set(), "in the stub, not in the module"


def test_every_method_and_property_of_each_class_is_in_the_stub_and_no_other():
    for node in stub().body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_native, node.name)
        stubbed = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        actual = public(name for name, _ in inspect.getmembers(cls)
                        if name in vars(cls) or any(name in vars(b) for b in cls.__mro__[:-1]))
        assert actual - stubbed == set(), f"{node.name}: in the class, not in the stub"
        assert public(stubbed) - actual == set(), f"{node.name}: in the stub, not in the class"
