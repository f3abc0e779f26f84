"""Tests of ``kvarena.anchor``: the conformance campaign against sglang 0.5.23's own allocator, the anchor
bugs it found and the pinned deviations (``conftest.py`` installs sglang when it is missing).
"""
