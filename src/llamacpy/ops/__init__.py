"""L2 kernels: model-agnostic numba kernels (matmul per weight format, norms, rope, attention).

Every kernel has a numpy twin (``*_numpy`` / ``*_ref``) used by the differential tests.
Importing this package registers the kernel cache locator (see :mod:`llamacpy.kernel_cache`).
"""

from .. import kernel_cache  # noqa: F401  (registers the kernels' disk cache locator)
