"""The `triton.language` rungs of the ladder: naive -> grouped -> persistent, and swap_ab for skinny problems.

Importing this package registers them with `tritongemm.registry`.
"""

from tritongemm.ladder import grouped, naive, persistent, swap_ab  # noqa: F401
