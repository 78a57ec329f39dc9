"""L2 kernels: model-agnostic numba kernels (matmul per weight format, norms, rope, attention).

Every kernel has a numpy twin (``*_numpy`` / ``*_ref``) used by the differential tests.
Importing this package registers the kernel cache locator (see :mod:`._cache`).
"""

from . import _cache

_cache.install()
