"""``python -m batchlab.model``: convert the embedded model once (or confirm the cached copy)."""

from batchlab.model.loading import converted_dir, load_model

loaded = load_model(verbose=True)
state = "cached copy" if loaded.from_cache else "converted now"
print(f"{loaded.name}: {state} in {converted_dir()}, loaded in {loaded.load_seconds:.1f} s "
      f"on {loaded.device} ({loaded.dtype})")
