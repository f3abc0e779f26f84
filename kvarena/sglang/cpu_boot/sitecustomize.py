"""Run at interpreter start by every process of an SGLang engine that
``kvarena.sglang.engine.cpu_environment`` set up (this folder is on its
``PYTHONPATH``).  SGLang's CPU engine imports ``sgl_kernel`` and, through
its multimodal configs, ``torchvision`` before any plugin of SGLang's runs,
and on a CPU-only machine neither can be installed (both wheels pull a CUDA
torch).  So, here: kvarena's CPU stand-ins answer ``sgl_kernel``
(``kvarena.sglang.cpu_ops``) and an empty module answers sglang's imports
of ``torchvision`` (``kvarena.anchor.loader``), each only where the real
one is missing."""

from kvarena.anchor.loader import install_torchvision_standin
from kvarena.sglang.cpu_ops import install

install()
install_torchvision_standin()
