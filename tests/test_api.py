"""The public surface: exported names, every name README shows, the exception tree,
pickling."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pickle
import re
import types

import procs
import pytest

import tierlock

# ``from tierlock... import a, b`` and ``import tierlock...`` lines of README's code, and
# the ``tierlock.Name`` it uses.
README_IMPORTS = re.compile(
    r"^\s*(?:from (tierlock[\w.]*) import ([\w, ]+)|import (tierlock[\w.]*))", re.M
)
README_NAMES = re.compile(r"\btierlock\.([A-Z]\w*)")


def test_all_public_names_are_exported() -> None:
    # (Submodules are attributes of the package once anything imported them.)
    public = {
        name
        for name in dir(tierlock)
        if not name.startswith("_") and not isinstance(getattr(tierlock, name), types.ModuleType)
    }
    assert public == set(tierlock.__all__) - {"__version__"}


def test_every_name_readme_shows_is_there() -> None:
    """README's imports and ``tierlock.Name``s, the command and the pytest plugin's
    entry point all resolve, wherever the modules behind them live."""
    readme = (procs.ROOT / "README.md").read_text(encoding="utf-8")
    imported = README_IMPORTS.findall(readme)
    assert len(imported) > 5
    for module, names, whole in imported:
        if whole:
            importlib.import_module(whole)
            continue
        found = importlib.import_module(module)
        for name in (part.strip() for part in names.split(",")):
            assert hasattr(found, name) or importlib.util.find_spec(f"{module}.{name}"), (
                f"from {module} import {name}"
            )
    for name in set(README_NAMES.findall(readme)):
        assert hasattr(tierlock, name), f"tierlock.{name}"
    entry_points = importlib.metadata.entry_points()
    (command,) = entry_points.select(group="console_scripts", name="tierlock")
    (plugin,) = entry_points.select(group="pytest11", name="tierlock")
    assert callable(command.load()) and isinstance(plugin.load(), types.ModuleType)


def test_exception_tree() -> None:
    assert issubclass(tierlock.LockTimeout, tierlock.LockError)
    assert issubclass(tierlock.LockTimeout, TimeoutError)
    assert issubclass(tierlock.NotHeldError, tierlock.LockError)
    assert issubclass(tierlock.NotHeldError, RuntimeError)
    assert issubclass(tierlock.LockLostError, tierlock.LockError)
    assert issubclass(tierlock.BackendError, tierlock.LockError)


@pytest.mark.parametrize(
    "error",
    [
        tierlock.LockError("boom", "k"),
        tierlock.LockTimeout("k", 1.5),
        tierlock.NotHeldError("k"),
        tierlock.LockLostError("k", 7),
        tierlock.BackendError("down", "k"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_errors_pickle_with_their_data(error: tierlock.LockError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.key == "k"
    assert vars(copy) == vars(error)
