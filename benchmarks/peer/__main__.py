"""``python -m benchmarks.peer``: see ``benchmarks.peer``."""

from .run import main

main()
