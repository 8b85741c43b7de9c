"""The array type the backends compute on, named once for every module of the package."""

from typing import Any

Array = Any
"""A backend array (numpy.ndarray on cpu, cupy.ndarray on cuda, mlx.core.array on metal)."""
