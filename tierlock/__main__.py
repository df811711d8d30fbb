"""``python -m tierlock``: the same as the ``tierlock`` command."""

from .cli import main

main(prog_name="tierlock")
