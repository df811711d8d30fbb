"""The public surface: exported names, the exception tree, pickling."""

from __future__ import annotations

import pickle
import types

import pytest

import tierlock


def test_all_public_names_are_exported() -> None:
    # (Submodules are attributes of the package once anything imported them.)
    public = {
        name
        for name in dir(tierlock)
        if not name.startswith("_") and not isinstance(getattr(tierlock, name), types.ModuleType)
    }
    assert public == set(tierlock.__all__) - {"__version__"}


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
