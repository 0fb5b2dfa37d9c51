"""tooljail's matplotlib backend: ``plt.show()`` sends the figures as artifacts.

Code calls get it as ``module://_tooljail_mpl`` (see _artifacts.py: it is set
while matplotlib is imported, unless MPLBACKEND names another backend). The
figures are drawn by the Agg canvas, so nothing needs a display; ``show()``
renders every open figure to PNG, hands it to the call's artifact sender
(source "figure": figure-1.png, figure-2.png...) and closes it.

Imported only by matplotlib (which is then importable); everything else it
uses is the standard library and _artifacts.py, beside it.
"""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg  # type: ignore[import-not-found,unused-ignore]

FigureCanvas = FigureCanvasAgg


def show(*args: Any, **kwargs: Any) -> None:
    """Send and close every open figure (``block`` and the rest mean nothing here)."""
    import _artifacts  # type: ignore[import-not-found]  # loaded by the runner
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    _artifacts.send_open_figures(plt)
