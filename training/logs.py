"""The package's logging (``setup_logging``, called first by the fine-tune, the bench and the
node check): one handler, INFO lines from rank 0 and warnings from every rank, each tagged with
its rank; and the library log lines a user of the package cannot act on, dropped (``NOISE``),
while every other line of those loggers, and every other warning, still shows:

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
import sys

from training.dist import DistEnv

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


def setup_logging(env: DistEnv) -> None:
    """One rank-0 logger: INFO lines from rank 0, warnings from every rank, each line tagged
    with its rank and written above the progress bar."""
    from tqdm import tqdm

    class TqdmHandler(logging.StreamHandler):
        def emit(self, rec: logging.LogRecord) -> None:
            tqdm.write(self.format(rec), file=sys.stderr)

    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if env.is_main else logging.WARNING)
    quiet_library_noise()
    for noisy in ("httpx", "huggingface_hub", "filelock", "torch.distributed.checkpoint"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # our own log lines say what loads
