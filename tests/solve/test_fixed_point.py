"""`eqattn.fixed_point` against finite differences and closed forms: every solver and exact
adjoint, jvp and vmap, pytrees, budgets and warm starts, and failures reported, not hidden."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqattn

from .problem import (
    EXACT_ADJOINTS,
    SOLVERS,
    TIGHT,
    D,
    N,
    central_difference,
    f,
    loss,
    problem,
)


def test_the_problem_is_contractive(getkey):
    args = problem()
    eq = eqattn.fixed_point(f, jnp.zeros((N, D)), args, solver=eqattn.Picard(**TIGHT))
    assert eq.converged and 8 <= eq.steps <= 20
    rho = eqattn.spectral_radius(f, eq.value, args, key=getkey(), steps=50)
    jac = jax.jacrev(lambda z: f(z, args))(eq.value).reshape(N * D, N * D)
    exact = np.max(np.abs(np.linalg.eigvals(jac)))
    assert exact < 0.2
    np.testing.assert_allclose(rho, exact, rtol=1e-3)


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "adjoint", EXACT_ADJOINTS, ids=lambda a: type(getattr(a, "linear_solver", a)).__name__
)
def test_gradient_matches_finite_differences(solver, adjoint):
    args = problem()
    grads = jax.jit(jax.grad(lambda a: loss(a, solver, adjoint)))(args)
    value = jax.jit(lambda a: loss(a, solver, adjoint))
    for index, entry in [(0, (1, 2)), (1, (3, 0)), (2, (2, 2)), (3, (4, 1))]:
        fd = central_difference(value, args, index, entry)
        np.testing.assert_allclose(grads[index][entry], fd, rtol=1e-6, atol=1e-9)


def test_unrolled_matches_implicit():
    args = problem(1)
    tight = eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT))
    implicit = jax.grad(lambda a: loss(a, eqattn.Anderson(**TIGHT), tight))(args)
    unrolled = jax.grad(lambda a: loss(a, eqattn.Anderson(**TIGHT), eqattn.Unrolled()))(args)
    for a, b in zip(implicit, unrolled):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_phantom_tends_to_the_implicit_gradient():
    args = problem(2)
    solver = eqattn.Anderson(**TIGHT)
    tight = eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT))
    exact = jax.grad(lambda a: loss(a, solver, tight))(args)

    def error(adjoint):
        g = jax.grad(lambda a: loss(a, solver, adjoint))(args)
        return sum(float(jnp.linalg.norm(a - b)) for a, b in zip(g, exact))

    errors = [error(eqattn.Phantom(steps=k)) for k in (1, 2, 4, 8)]
    assert all(b < a * 0.5 for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-6
    # JacobianFree is the one-step phantom gradient: biased, but correlated with the exact one.
    jfb = error(eqattn.JacobianFree())
    np.testing.assert_allclose(jfb, errors[0], rtol=1e-10)
    assert 0 < jfb < sum(float(jnp.linalg.norm(g)) for g in exact)


def test_forward_value_does_not_depend_on_the_adjoint():
    args = problem()
    values = [
        eqattn.fixed_point(f, jnp.zeros((N, D)), args, adjoint=adj).value
        for adj in (
            eqattn.ImplicitAdjoint(),
            eqattn.Phantom(3),
            eqattn.JacobianFree(),
            eqattn.Unrolled(),
        )
    ]
    for v in values[1:]:
        np.testing.assert_allclose(v, values[0], rtol=1e-12)


def _tanh_layer(z, args):
    w, x = args
    return jnp.tanh(z @ w + x)


def test_shared_inverse_reuses_the_broyden_estimate():
    # SHINE: the forward Broyden's inverse estimate gives the backward solve for free; a few
    # refining steps make it match the implicit gradient. Reference: implicit, tight Picard.
    args = problem()
    broyden = eqattn.Broyden(**TIGHT)
    exact = jax.grad(loss)(args, broyden, eqattn.ImplicitAdjoint(eqattn.Picard(**TIGHT)))

    def error(adjoint):
        g = jax.grad(loss)(args, broyden, adjoint)
        return max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(g, exact))

    free, refined = error(eqattn.SharedInverse()), error(eqattn.SharedInverse(refine=3))
    assert refined < 1e-4 < free < error(eqattn.JacobianFree())
    assert free < 0.2
    with pytest.raises(ValueError, match="must be eqattn.Broyden"):
        loss(args, eqattn.Anderson(), eqattn.SharedInverse())
    with pytest.raises(ValueError, match="refine"):
        eqattn.SharedInverse(refine=-1)


@pytest.mark.parametrize(
    "adjoint",
    [eqattn.Phantom(steps=40), eqattn.JacobianFree(), eqattn.Unrolled()],
    ids=lambda a: type(a).__name__,
)
def test_jvp_where_supported(adjoint):
    # Forward mode works for these adjoints (when f supports it; eqattn's attention core is
    # reverse mode only, hence a tanh layer here).
    rng = np.random.default_rng(3)
    w, x = rng.normal(size=(D, D)) * 0.2, rng.normal(size=(N, D))
    tw = rng.normal(size=(D, D))

    def solve(w):
        return eqattn.fixed_point(
            _tanh_layer, jnp.zeros((N, D)), (w, x), solver=eqattn.Anderson(**TIGHT), adjoint=adjoint
        ).value

    _, tangent = jax.jvp(solve, (w,), (tw,))
    _, vjp = jax.vjp(solve, w)
    # <J t, c> == <t, J^T c>
    c = rng.normal(size=(N, D))
    np.testing.assert_allclose(jnp.vdot(tangent, c), jnp.vdot(tw, vjp(c)[0]), rtol=1e-8)


def test_vmap_gives_per_example_statistics():
    args = problem()
    xs = np.stack([args[3] * s for s in (0.0, 1.0, 3.0)])

    def solve(x):
        return eqattn.fixed_point(
            f, jnp.zeros((N, D)), args[:3] + (x,), solver=eqattn.Picard(**TIGHT)
        )

    eqs = jax.jit(jax.vmap(solve))(xs)
    assert eqs.steps.shape == (3,) and eqs.converged.shape == (3,)
    assert np.all(eqs.converged)
    assert len(set(np.asarray(eqs.steps).tolist())) > 1  # each example stopped on its own
    for i in range(3):
        single = solve(xs[i])
        assert int(single.steps) == int(eqs.steps[i])
        np.testing.assert_allclose(single.value, eqs.value[i], rtol=1e-12)


@pytest.mark.parametrize("kind", [eqattn.Picard, eqattn.Anderson, eqattn.Broyden])
def test_check_every_changes_nothing_but_the_trips(kind):
    # Examples that stop at different steps, under vmap, with a budget that cuts one of them
    # short and is not a multiple of check_every: values and statistics are those of one
    # step per trip, and the backward solve (same solver) agrees too.
    args = problem()
    xs = np.stack([args[3] * s for s in (0.0, 1.0, 3.0)])

    def solve(x, check_every, budget=None):
        solver = kind(**TIGHT, check_every=check_every)
        adjoint = eqattn.ImplicitAdjoint(linear_solver=kind(**TIGHT, check_every=check_every))
        eq = eqattn.fixed_point(
            f,
            jnp.zeros((N, D)),
            args[:3] + (x,),
            solver=solver,
            adjoint=adjoint,
            budget=budget,
        )
        return eq

    for max_steps in (None, 7):
        one = jax.vmap(lambda x: solve(x, 1, max_steps))(xs)
        four = jax.vmap(lambda x: solve(x, 4, max_steps))(xs)
        np.testing.assert_array_equal(one.steps, four.steps)
        np.testing.assert_array_equal(one.converged, four.converged)
        np.testing.assert_allclose(four.value, one.value, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(four.residual, one.residual, rtol=1e-9, atol=1e-16)
    assert len(set(np.asarray(one.steps).tolist())) > 1

    def loss(x, check_every):
        return jnp.sum(jnp.sin(solve(x, check_every).value))

    np.testing.assert_allclose(
        jax.grad(loss)(xs[2], 3), jax.grad(loss)(xs[2], 1), rtol=1e-10, atol=1e-12
    )
    with pytest.raises(ValueError, match="check_every"):
        kind(check_every=0)


def test_low_precision_states():
    # The small least-squares solve of Anderson runs in float32 whatever the state's dtype.
    args = tuple(jnp.asarray(a, jnp.bfloat16) for a in problem())
    for solver in (eqattn.Anderson(rtol=1e-2), eqattn.Picard(rtol=1e-2)):
        eq = eqattn.fixed_point(f, jnp.zeros((N, D), jnp.bfloat16), args, solver=solver)
        assert eq.value.dtype == jnp.bfloat16 and eq.converged
        ref = eqattn.fixed_point(
            f,
            jnp.zeros((N, D)),
            tuple(jnp.asarray(a, jnp.float64) for a in args),
            solver=eqattn.Picard(**TIGHT),
        )
        assert np.max(np.abs(np.asarray(eq.value, np.float64) - ref.value)) < 0.05


def test_pytree_state_and_closed_over_parameters():
    rng = np.random.default_rng(4)
    w1, w2 = rng.normal(size=(3, 3)) * 0.3, rng.normal(size=(2, 2)) * 0.3
    x = {"a": rng.normal(size=3), "b": rng.normal(size=2)}

    def loss(w1, w2):
        def f(z, _):  # closes over w1, w2 and x
            return {
                "a": jnp.tanh(w1 @ z["a"] + x["a"]),
                "b": jnp.tanh(w2 @ z["b"] + jnp.sum(z["a"]) * x["b"]),
            }

        z0 = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
        tight = eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT))
        eq = eqattn.fixed_point(f, z0, solver=eqattn.Anderson(**TIGHT), adjoint=tight)
        return jnp.sum(eq.value["a"] ** 2) + jnp.sum(jnp.cos(eq.value["b"]))

    g = jax.grad(loss, argnums=(0, 1))(w1, w2)
    h = 1e-6
    for i, w in enumerate((w1, w2)):
        e = np.zeros_like(w)
        e[1, 0] = h
        args_p = [w1, w2]
        args_m = [w1, w2]
        args_p[i], args_m[i] = w + e, w - e
        fd = (loss(*args_p) - loss(*args_m)) / (2 * h)
        np.testing.assert_allclose(g[i][1, 0], fd, rtol=1e-6)


@pytest.mark.parametrize("solver", [eqattn.Picard, eqattn.Anderson, eqattn.Broyden])
def test_a_growing_state_that_passes_the_test_is_the_answer(solver):
    """From zeros the state grows far past its start (as propagation over a graph does): the
    iterate that passes the relative test is returned and reported converged, though the
    start's absolute residual (1) is lower than the converged one's (about 100); Broyden does
    not restart at its start (its restart rule ranks iterates as the loop does)."""
    f = lambda x, _: jnp.stack([jnp.ones(()), 1e6 * x[0] + 0.5 * x[1]])  # noqa: E731
    eq = eqattn.fixed_point(f, jnp.zeros(2), solver=solver(rtol=1e-4, max_steps=100))
    assert eq.converged
    if solver is not eqattn.Broyden:  # Broyden solves this linear map exactly (residual 0)
        assert float(eq.residual) > 1.0
    np.testing.assert_allclose(eq.value, [1.0, 2e6], rtol=2e-4)  # the closed form


def test_non_contractive_is_reported():
    f = lambda z, _: 2 * z + 1  # noqa: E731
    eq = eqattn.fixed_point(f, jnp.zeros(3), solver=eqattn.Picard(max_steps=10))
    assert not eq.converged
    assert int(eq.steps) == 10
    # the iterate the stopping test rates best (the residual over atol + rtol |f(z)|): here
    # the last tested, z_9 = 2^9 - 1, whose relative residual 512 / 1023 is the lowest
    np.testing.assert_allclose(eq.value, 511.0)
    np.testing.assert_allclose(eq.relative_residual, 512 / 1023, rtol=1e-6)
    # (Anderson would solve this linear map exactly, so use Picard.)
    solve = eqx.filter_jit(lambda z: eqattn.fixed_point(f, z, solver=eqattn.Picard(), throw=True))
    with pytest.raises(eqx.EquinoxRuntimeError, match="did not converge"):
        jax.block_until_ready(solve(jnp.zeros(3)).value)
    # under plain jax.jit the same error comes wrapped in JAX's runtime error
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.jit(solve)(jnp.zeros(3)).value)


def test_nan_stops_the_solve():
    f = lambda z, _: jnp.log(z - 1.0)  # NaN from the first step  # noqa: E731
    eq = eqattn.fixed_point(f, jnp.zeros(2), solver=eqattn.Anderson())
    assert not eq.converged and int(eq.steps) == 1 and np.isinf(eq.residual)
    # no finite evaluation of f at all: the answer is NaN, not the start
    assert np.all(np.isnan(eq.value)) and eq.result == eqattn.RESULTS.nonfinite
    # f fine at z0 but NaN further on: stop there, keep the best finite iterate
    g = lambda z, _: jnp.where(z > 0.5, jnp.nan, z + 0.3)  # noqa: E731
    eq = eqattn.fixed_point(g, jnp.zeros(2), solver=eqattn.Picard())
    assert not eq.converged and int(eq.steps) == 3 and np.all(np.isfinite(eq.value))
    assert eq.result == eqattn.RESULTS.nonfinite


def test_warm_start_and_step_budget_without_recompiling():
    args = problem()
    traces = []

    @jax.jit
    def solve(z0, budget):
        traces.append(None)
        return eqattn.fixed_point(f, z0, args, solver=eqattn.Picard(**TIGHT), budget=budget)

    z0 = jnp.zeros((N, D))
    few, full = solve(z0, 3), solve(z0, 60)
    assert int(few.steps) == 3 and not few.converged
    # a budget of one evaluation only tests the start: the start comes back, unconverged (why
    # the command line refuses --max-steps / --train-steps 1)
    one = solve(z0 + 0.5, 1)
    assert int(one.steps) == 1 and not one.converged and bool(jnp.all(one.value == 0.5))
    assert full.converged and int(full.steps) > 3
    warm = solve(full.value, 60)
    assert warm.converged and int(warm.steps) == 1
    assert len(traces) == 1


@pytest.mark.parametrize(
    "adjoint",
    [eqattn.ImplicitAdjoint(), eqattn.Unrolled(), eqattn.Phantom(3)],
    ids=lambda a: type(a).__name__,
)
def test_z0_computed_from_the_parameters_gets_no_gradient(adjoint):
    # z* does not depend on z0, so a z0 built from the parameters adds nothing to the gradient.
    args = problem()

    def loss(args, start):
        z0 = start(args)
        eq = eqattn.fixed_point(f, z0, args, solver=eqattn.Anderson(**TIGHT), adjoint=adjoint)
        return jnp.sum(jnp.sin(eq.value))

    from_params = jax.grad(loss)(args, lambda a: a[3] @ a[0])
    from_zeros = jax.grad(loss)(args, lambda a: jnp.zeros((N, D)))
    for a, b in zip(from_params, from_zeros):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)


def test_jacobian_frobenius_is_unbiased(getkey):
    args = problem()
    z = jnp.asarray(np.random.default_rng(5).normal(size=(N, D)))
    exact = np.sum(np.asarray(jax.jacrev(lambda z: f(z, args))(z)) ** 2)
    est = eqattn.jacobian_frobenius(f, z, args, key=getkey(), samples=4000)
    np.testing.assert_allclose(est, exact, rtol=0.05)
    # differentiable with respect to the parameters
    penalty = lambda a: eqattn.jacobian_frobenius(f, z, a, key=jax.random.key(0))  # noqa: E731
    g = jax.jit(jax.grad(penalty))(args)
    assert all(np.all(np.isfinite(x)) for x in g)


def test_bad_arguments():
    with pytest.raises(ValueError, match="same structure|structure, shapes and dtypes"):
        eqattn.fixed_point(lambda z, _: z[:2], jnp.zeros(3))
    with pytest.raises(ValueError, match="floating-point"):
        eqattn.fixed_point(lambda z, _: z, jnp.zeros(3, int))
    with pytest.raises(ValueError, match="damping"):
        eqattn.Picard(damping=0.0)
    with pytest.raises(ValueError, match="history_size"):
        eqattn.Anderson(history_size=0)
    with pytest.raises(ValueError, match="rtol"):
        eqattn.Broyden(rtol=0.0, atol=0.0)
    with pytest.raises(ValueError, match="`solver`"):
        eqattn.fixed_point(lambda z, _: z, jnp.zeros(3), solver="anderson")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_anderson_small_solve_matches_numpy(rng, dtype):
    """Anderson's unrolled m x m solve against LAPACK in float64, on the ridged Gram matrices it
    sees: nearly collinear residuals (condition number up to about 1e8) and empty slots."""
    from eqattn._solve._solvers import _solve_spd

    for m, spread in [(1, 1.0), (3, 1.0), (5, 1e-2), (5, 1e-4), (8, 1e-3)]:
        g = rng.normal(size=(1, 40)) + spread * rng.normal(size=(m, 40))
        h = g @ g.T
        h += 1e-4 * np.max(np.diag(h)) * np.eye(m)
        b = (np.arange(m) < max(1, m - 1)).astype(float)
        if m > 2:
            h[-1, :] = h[:, -1] = 0
            h[-1, -1] = 1  # an empty slot: the identity, right-hand side 0
        ref = np.linalg.solve(h, b)
        got = np.asarray(_solve_spd(jnp.asarray(h, dtype), jnp.asarray(b, dtype)), np.float64)
        # backward stable: the error is about cond(h) eps relative
        tol = np.linalg.cond(h) * np.finfo(dtype).eps * 10
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol * np.abs(ref).max())


def test_a_solver_of_no_known_library_is_refused():
    with pytest.raises(ValueError, match="must be one of eqattn's fixed-point solvers"):
        eqattn.fixed_point(lambda z, _: z, jnp.zeros(2), solver="anderson")
