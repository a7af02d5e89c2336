"""Library log lines a user of the package cannot act on, dropped where the package sets up its
logging (``finetune.setup_logging``); every other line of these loggers, and every other
warning, still shows.

- torchao's optional C++ kernels (``torchao/_C*.so``: MX formats, CUTLASS for sm90a) fail to
  load wherever they were not built for the interpreter or the GPU; the package's float8 path
  (``torchao.float8`` on ``torch._scaled_mm``) does not use them.
- torchao's int8 matmul kernels need Triton, which CPU-only builds lack; the package does not use
  them.
- torch 2.13 tells whoever registers an Enum as a pytree constant (torchao, at import) that
  torch.compile supports Enums natively: a deprecation note for torchao's authors.
"""

from __future__ import annotations

import logging
import re

NOISE: dict[str, re.Pattern[str]] = {
    "torchao": re.compile(r"^Failed to load \S*/torchao/_C\w*\S*\.so: "),
    "torchao.kernel.intmm": re.compile(r"^Warning: Detected no triton, on systems without Triton"),
    "torch.utils._pytree": re.compile(r"^<enum '\w+'> is an Enum subclass and is now natively supported by "
                                      r"torch\.compile"),
}
"""Logger -> the messages of it that are dropped."""


class _Drop(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_library_noise() -> None:
    """Drop the lines of ``NOISE`` (once per logger, however often it is called)."""
    for name, pattern in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(pattern))
