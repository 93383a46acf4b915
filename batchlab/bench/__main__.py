"""``python -m batchlab.bench``: see ``batchlab.bench``."""

from batchlab.bench.run import main

main()
