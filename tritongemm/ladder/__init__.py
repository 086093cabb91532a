"""The `triton.language` rungs of the ladder: naive -> grouped -> persistent.

Importing this package registers them with `tritongemm.registry`.
"""

from tritongemm.ladder import grouped, naive, persistent  # noqa: F401
