"""How long a step takes, measured or predicted: the models the simulator (``SimBackend``) asks.

- ``cost_model``     the additive step-time formula (``CostModel``) and its fit to measured steps
- ``roofline``       the GPU step-time formula (datasheet roofline, or grounded in measured kernels)
- ``device_presets``, ``kernels``, ``grounded_step``  its pieces: GPU presets, one kernel's
                     time, a whole step summed kernel by kernel (models' shapes:
                     ``batchlab.shapes``)
- ``kernel_profiles``, ``kernel_fit``  measured kernel times (``data/gpu_kernels/``) read, compared
                     with a preset, and fitted into one
- ``measured_kernels``, ``attention_fit``, ``measured_step``  vLLM's own kernels measured per GPU
                     and vLLM version (AIConfigurator's tables in ``aiconfigurator-core``),
                     attention fitted to them, and a step summed from them
- ``collectives``, ``kv_links``  an all-reduce among tensor-parallel GPUs; the links a KV
                     hand-off crosses

Calibration (measuring the real model to fit a cost model) runs the engine, so it lives above
it, in ``batchlab.experiments.calibration``.
"""
