"""The serving simulator: a scheduler (``engine``) driving the unified arena or
a static split (``backends``); ``kvarena simulate`` (``kvarena/simulate.py``)
runs the setups side by side and reports."""
