"""Import-only stand-ins for modules that need a GPU / CUDA-only wheels (written by selfspec's engine installer)."""
import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ()


class _Missing:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name} is an import-only stand-in (a GPU/CUDA-only module); it cannot run here")

    def __mro_entries__(self, bases):
        return (object,)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr, _n=spec.name: (_ for _ in ()).throw(AttributeError(attr)) if attr.startswith("__") else _Missing(f"{_n}.{attr}")
        return mod

    def exec_module(self, module):
        pass


if STUBBED:
    sys.meta_path.insert(0, _Finder())
