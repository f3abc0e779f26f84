"""The simulator's SGLang defaults (``kvarena.sim.engines``) read from the
installed SGLang itself, so an upgrade that changes one fails here."""

from kvarena.sim import engines


def test_sglang_ships_prefill_unmixed():
    """``--enable-mixed-chunk`` is off by default: the simulator's SGLang
    setups run each prefill chunk as a pass of its own."""
    from sglang.srt.arg_groups.fields.schedule import Schedule

    assert Schedule().enable_mixed_chunk is False
    assert engines.SGLANG.mixed_chunk == Schedule().enable_mixed_chunk
