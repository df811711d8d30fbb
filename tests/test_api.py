"""The public surface: exported names, every name README and the documentation show,
the API reference, the exception tree, pickling."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import pickle
import re
import types

import procs
import pytest

import tierlock

# ``from tierlock... import a, b`` and ``import tierlock...`` lines of README's and the
# documentation's code, and the ``tierlock.Name`` they use.
README_IMPORTS = re.compile(
    r"^\s*(?:from (tierlock[\w.]*) import ([\w, ]+)|import (tierlock[\w.]*))", re.M
)
README_NAMES = re.compile(r"\btierlock\.([A-Z]\w*)")
# A fenced Python block of a Markdown page; its code is group 1.
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
DOCS = procs.ROOT / "docs"
# An API reference entry that lists the members of its module: the module, the list.
MEMBERS = re.compile(r"^::: (tierlock[\w.]*)\n    options:\n      members:\s*\[([^\]]*)\]", re.M)


def test_all_public_names_are_exported() -> None:
    # (Submodules are attributes of the package once anything imported them.)
    public = {
        name
        for name in dir(tierlock)
        if not name.startswith("_") and not isinstance(getattr(tierlock, name), types.ModuleType)
    }
    assert public == set(tierlock.__all__) - {"__version__"}


def missing_names(text: str) -> list[str]:
    """The ``tierlock`` imports and ``tierlock.Name``s of ``text`` that do not resolve,
    wherever the modules behind them live."""
    missing = []
    for module, names, whole in README_IMPORTS.findall(text):
        if whole:
            importlib.import_module(whole)
            continue
        found = importlib.import_module(module)
        for name in (part.strip() for part in names.split(",")):
            # A name of the module, or a submodule of a package.
            if not hasattr(found, name) and not (
                hasattr(found, "__path__") and importlib.util.find_spec(f"{module}.{name}")
            ):
                missing.append(f"from {module} import {name}")
    names = set(README_NAMES.findall(text))
    return missing + [f"tierlock.{name}" for name in sorted(names) if not hasattr(tierlock, name)]


def syntax_errors(page: str) -> list[str]:
    """The Python blocks of a Markdown page that do not compile (top-level ``await`` and
    ``async with`` allowed, as in asyncio's REPL)."""
    errors = []
    for block in PYTHON_BLOCK.finditer(page):
        try:
            compile(block[1], "<page>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as error:
            line = page.count("\n", 0, block.start(1)) + (error.lineno or 1)
            errors.append(f"line {line}: {error.msg}")
    return errors


def test_every_name_readme_shows_is_there() -> None:
    """README's imports and ``tierlock.Name``s, the command and the pytest plugin's
    entry point all resolve, and its Python compiles."""
    readme = (procs.ROOT / "README.md").read_text(encoding="utf-8")
    assert README_IMPORTS.search(readme) and README_NAMES.search(readme)
    assert missing_names(readme) == []
    assert syntax_errors(readme) == []
    entry_points = importlib.metadata.entry_points()
    (command,) = entry_points.select(group="console_scripts", name="tierlock")
    (plugin,) = entry_points.select(group="pytest11", name="tierlock")
    assert callable(command.load()) and isinstance(plugin.load(), types.ModuleType)


def test_every_name_the_documentation_shows_is_there() -> None:
    """The Python blocks of every page in docs/ compile, and their imports and
    ``tierlock.Name``s resolve."""
    pages = {
        path.relative_to(DOCS).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(DOCS.rglob("*.md"))
    }
    code = {name: "\n".join(PYTHON_BLOCK.findall(page)) for name, page in pages.items()}
    assert sum(len(README_IMPORTS.findall(text)) for text in code.values()) > 5
    problems = {
        name: missing_names(code[name]) + syntax_errors(page) for name, page in pages.items()
    }
    assert {name: found for name, found in problems.items() if found} == {}


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name of ``tierlock.__all__`` has its entry, and a module whose entry lists
    its members lists the whole of its ``__all__``."""
    reference = DOCS / "reference"
    shown = re.findall(r"^::: tierlock\.(\w+)$", (reference / "tierlock.md").read_text(), re.M)
    assert sorted(shown) == sorted(set(tierlock.__all__) - {"__version__"})
    pages = "\n".join(path.read_text(encoding="utf-8") for path in reference.glob("*.md"))
    listed = {module: names for module, names in MEMBERS.findall(pages)}
    assert {"tierlock.contrib.flask", "tierlock.metrics"} <= listed.keys()
    for module, names in listed.items():
        members = {name.strip() for name in names.split(",")}
        assert members == set(importlib.import_module(module).__all__), module


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
