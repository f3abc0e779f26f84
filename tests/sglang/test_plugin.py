"""How a server turns kvarena on: the ``sglang.srt.plugins`` entry point,
which SGLang's own ``load_plugins`` runs in every scheduler process, and the
``KVARENA_SGLANG`` switch it reads."""

import importlib.metadata

import pytest

from kvarena import sglang as ks
from kvarena.anchor.loader import import_sglang
from kvarena.sglang import allocators, factories, stacks


def test_the_entry_point_is_registered_by_the_install():
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "kvarena"]
    assert len(eps) == 1 and eps[0].load() is factories.plugin


@pytest.mark.parametrize("value, policy", [("1", "planner"), ("planner", "planner"), ("anchor", "anchor")])
def test_sglangs_load_plugins_installs_kvarena_when_asked(monkeypatch, value, policy):
    monkeypatch.setenv(factories.ENV, value)
    monkeypatch.setenv("SGLANG_PLUGINS", "kvarena")  # SGLang's own whitelist: only ours runs here
    plugins = import_sglang("sglang.srt.plugins")
    monkeypatch.setattr(plugins, "_plugins_loaded", False, raising=False)
    plugins.load_plugins()
    assert ks.installed()
    a = stacks.build("swa").token_to_kv_pool_allocator
    assert isinstance(a, allocators.UnifiedSWATokenToKVPoolAllocator) and a.policy == policy


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_the_hook_does_nothing_unless_asked(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(factories.ENV, raising=False)
    else:
        monkeypatch.setenv(factories.ENV, value)
    factories.plugin()
    assert not ks.installed()
    assert not isinstance(stacks.build("swa").token_to_kv_pool_allocator, allocators.ALLOCATORS)


def test_a_bad_switch_value_says_what_to_write(monkeypatch):
    monkeypatch.setenv(factories.ENV, "yes please")
    with pytest.raises(ValueError, match="KVARENA_SGLANG"):
        factories.plugin()
    assert not ks.installed()
