"""Tests of ``kvarena.sglang``: kvarena as the allocator of sglang 0.5.23's unified-memory stack, driven by SGLang's
own pools, caches and scheduler helpers on CPU (``conftest.py`` installs sglang when it is missing).
"""
