"""``python -m tierlock``: the same as the ``tierlock`` command."""

from .tools.cli import main

main(prog_name="tierlock")
