"""Sliders around plain functions, for notebooks.

The rules and their reasons: ``docs/workloads-and-metrics.md``.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from batchlab.checks import check_callable, fail, is_number

_MISSING_IPYWIDGETS = (
    "explore() needs ipywidgets (pip install ipywidgets) and a Jupyter front end to show the "
    "sliders. Without them, call the function directly with fixed values instead, "
    "e.g. fn(rate=2).")


def _import_ipywidgets():
    try:
        import ipywidgets
    except ImportError as err:
        raise ImportError(_MISSING_IPYWIDGETS) from err
    return ipywidgets


def _default_of(fn: Callable, name: str) -> Any:
    param = inspect.signature(fn).parameters.get(name)
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def make_control(widgets, name: str, spec: Any, default: Any = None,
                 continuous_update: bool = False):
    """Turn one keyword of ``explore`` into a widget, or return ``None`` for a fixed value.

    * ``(min, max)`` or ``(min, max, step)`` of numbers -> a slider (``IntSlider`` when all are
      ints, else ``FloatSlider``), starting at the function's default when it lies in range.
    * a list -> a dropdown of its items; a dict -> a dropdown of ``{label: value}``.
    * ``True`` / ``False`` -> a checkbox.
    * an ipywidgets widget -> used as given.
    * anything else (a number, a string, a Trace...) -> passed to the function unchanged.
    """
    if isinstance(spec, widgets.ValueWidget):
        return spec
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(is_number(v) for v in spec):
        lo, hi = spec[0], spec[1]
        step = spec[2] if len(spec) == 3 else None
        if not lo < hi:
            fail(name, spec, "a slider (min, max) or (min, max, step) with min < max")
        if step is not None and step <= 0:
            fail(name, spec, "a slider (min, max, step) with step > 0")
        value = default if is_number(default) and lo <= default <= hi else lo
        if all(isinstance(v, numbers.Integral) for v in spec):
            return widgets.IntSlider(value=int(value), min=lo, max=hi, step=step or 1,
                                     description=name, continuous_update=continuous_update)
        return widgets.FloatSlider(value=float(value), min=lo, max=hi,
                                   step=step if step is not None else (hi - lo) / 100,
                                   description=name, continuous_update=continuous_update)
    if isinstance(spec, list):
        if not spec:
            fail(name, spec, "a dropdown list with at least one option")
        value = default if default in spec else spec[0]
        return widgets.Dropdown(options=spec, value=value, description=name)
    if isinstance(spec, Mapping):
        if not spec:
            fail(name, spec, "a dropdown dict with at least one option")
        options = list(spec.items())
        values = [v for _, v in options]
        value = default if default in values else values[0]
        return widgets.Dropdown(options=options, value=value, description=name)
    if isinstance(spec, bool):
        return widgets.Checkbox(value=spec, description=name)
    return None


def _show(result: Any) -> None:
    """Display what the function returned: a figure (then closed, so it is not shown twice),
    the figure of an Axes, or any other object with a rich display."""
    if result is None:
        return
    from IPython.display import display
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    fig = result.figure if isinstance(result, Axes) else result
    if isinstance(fig, Figure):
        import matplotlib.pyplot as plt
        display(fig)
        plt.close(fig)
    else:
        display(result)


def explore(fn: Callable[..., Any], /, *, continuous_update: bool = False, **controls: Any):
    """Sliders (and dropdowns, checkboxes) for the keyword arguments of ``fn``; redraws on change.

    Returns an ``ipywidgets.VBox`` with the controls above the output area. ``fn`` is called once
    right away with the starting values and again after every change (by default only when a
    slider is released: ``continuous_update=False`` keeps slow figures responsive). Each keyword
    names a parameter of ``fn``; see ``make_control`` for what each kind of value becomes.
    """
    check_callable("fn", fn, "a function to call", hint="explore(fn, name=control, ...)")
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [name for name in controls if name not in params and not takes_any]
    if unknown:
        fn_name = getattr(fn, "__name__", fn)
        fail(unknown[0], controls[unknown[0]], f"a control for a parameter of {fn_name!s}",
             f"it has no parameter(s) {unknown}; its parameters are {list(params)}")
    widgets = _import_ipywidgets()

    interactive_controls, fixed_values = {}, {}
    for name, spec in controls.items():
        control = make_control(widgets, name, spec, _default_of(fn, name), continuous_update)
        if control is None:
            fixed_values[name] = spec
        else:
            interactive_controls[name] = control

    def draw(**values: Any) -> None:
        _show(fn(**fixed_values, **values))

    output = widgets.interactive_output(draw, interactive_controls)
    return widgets.VBox([widgets.VBox(list(interactive_controls.values())), output])
