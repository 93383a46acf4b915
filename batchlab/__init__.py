"""batchlab: how LLM inference servers batch requests, measured on a real model.

One step is ``plan = scheduler.schedule(now)`` -> ``backend.run(plan)`` -> apply the tokens ->
``scheduler.remove_ended()`` (``Engine.step`` in ``engine.py``); imports only run downward. The
map of every module, the order to read the core in and a request's path through it are in
``docs/architecture.md``; each folder's ``__init__`` says why the folder exists.
"""

__version__ = "0.1.0"
