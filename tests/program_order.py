"""Interpreted Triton kernels with their programs run in reverse order.

Triton's interpreter runs a launch's programs one after the other in grid order, so a kernel whose
programs depend on each other's memory (one writes what another reads) can pass every interpreted
test by luck of that order, and race on a GPU. Run once in grid order and once reversed, any such
dependency between two programs changes a result in one of the two.
"""

import contextlib


@contextlib.contextmanager
def programs_reversed():
    """Inside: every interpreted launch runs program (x, y, z) where it would run (X-1-x, Y-1-y, Z-1-z)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    in_grid_order = builder.set_grid_idx

    def reflected(x, y, z):
        nx, ny, nz = builder.grid_dim
        in_grid_order(nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = reflected
    try:
        yield
    finally:
        del builder.set_grid_idx  # the class's method again
