"""Every solver against an exact solution, with the observed order of convergence asserted."""

import pytest

from gno_ext.solvers.verification import CASES

# (lowest order, highest order, largest error at the finest resolution)
BOUNDS = {
    "heat-dirichlet": (1.95, 2.05, 2e-4),
    "heat-neumann": (1.95, 2.05, 2e-4),
    "heat-time-dependent": (1.8, 2.2, 1e-4),
    "advection-weno5": (2.8, 5.5, 1e-5),      # SSP-RK3 time error (dt ~ h) dominates WENO's h^5
    "advection-muscl": (1.6, 2.2, 5e-3),      # the limiter clips smooth extrema
    "advection-rotation": (2.8, 5.5, 5e-5),
    # flow through bounded faces: the WENO-extrapolated ghost cells keep the scheme's order
    "advection-inflow-dirichlet": (2.5, 5.5, 1e-5),
    "advection-inflow-neumann": (2.5, 4.0, 5e-5),
    "burgers-cole-hopf": (1.8, 2.2, 1e-4),
    "ns-taylor-green": (1.9, 2.1, 1e-6),
}


def test_every_case_has_bounds():
    assert set(BOUNDS) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_observed_order_of_convergence(name):
    low, high, finest = BOUNDS[name]
    errors, orders = CASES[name].run()
    assert errors[-1] < finest, errors
    assert all(low < p < high for p in orders), (errors, orders)
