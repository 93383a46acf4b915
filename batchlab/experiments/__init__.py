"""Experiments the notebooks run: they build workloads, serve them with engines, and summarise.

- ``prefill_stall``  what a newcomer's long prompt does to the decodes already running, and how
                     chunked prefill spreads it out
- ``sweeps``         load sweeps: the same requests at several rates, under several policies
- ``calibration``    measure real steps of the model, fit the simulator's cost model to them,
                     check it on other traces

Why a folder: these are neither the serving core nor pure analysis; each one is a lesson's
measurement, written once so a notebook and its exercises run the same experiment.
"""
