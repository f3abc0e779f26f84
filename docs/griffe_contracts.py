"""A griffe extension for the API reference: the spec's PEP 316 contract lines
(``pre:``, ``post:``, ``inv:``, ``raises:``) shown as code, so ``__old__`` and
``__return__`` read as written instead of as Markdown bold."""

import re

import griffe

_CONTRACT = re.compile(r"^(\s*)((?:pre|post|inv|raises)(?:\[[^\]]*\])?:.*?)\s*$")


class ContractsAsCode(griffe.Extension):
    """Wraps each contract line of a docstring in backticks."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is None:
            return
        lines = obj.docstring.value.splitlines()
        code = [_CONTRACT.sub(lambda m: f"{m.group(1)}`{m.group(2)}`  ", line) for line in lines]
        obj.docstring.value = "\n".join(code)
