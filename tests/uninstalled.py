"""A child Python without some installed libraries, for the tests of what a user sees
when an extra is missing; and what tierlock takes, to check the messages that list it."""

from __future__ import annotations

__all__ = ["ALL_SCHEMES", "EXTRA_MODULES", "without"]

# Python without some installed modules, for a child process: a finder put first on the
# meta path refuses them (submodules too), so that importing one fails as in a venv
# where it was never installed, with ModuleNotFoundError "No module named 'redis'" and
# ``name`` "redis", while everything else imports from this venv. A None put in
# sys.modules instead fails otherwise ("import of redis halted", or for a submodule
# "'redis' is not a package", naming the submodule), and uninstalling the library for
# real would take it from the tests running beside.
UNINSTALLED = """
import sys
from importlib.abc import MetaPathFinder


class Uninstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in UNINSTALLED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())
"""


def without(*modules: str) -> str:
    """Code that leaves a child Python without ``modules``: run it before the child's
    own, as ``python -c``."""
    return f"UNINSTALLED = {sorted(modules)!r}\n{UNINSTALLED}\n"


# The engines' client libraries and the drivers that the extras install.
EXTRA_MODULES = ("redis", "kazoo", "pymysql", "psycopg")


# Every scheme tierlock takes, as a message about one it does not must list them.
ALL_SCHEMES = {
    "sqlite",
    "mysql",
    "mariadb",
    "postgresql",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "zookeeper",
    "file",
}
