"""The implicit adjoint's backward solve: a short solve returns its next step, each example
stops on its own under vmap, a solve cut short, and a failed backward reported."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import eqattn

from .problem import SOLVERS, TIGHT, loss, problem


@pytest.mark.parametrize("damping", [1.0, 0.5])
def test_a_short_picard_backward_returns_its_next_step(damping):
    """ImplicitAdjoint(Picard(max_steps=k)) out of steps gives the (k+1)-th iterate of u = g +
    J^T u, which its k vector-Jacobian products paid for: for f(z) = a z + theta (J = a I,
    df/dtheta = I) and L = c . z*, the gradient in closed form."""
    a, k = 0.8, 6
    c = np.array([1.0, -2.0, 0.5])
    rate = 1 - damping * (1 - a)  # u_{i+1} - u* = rate (u_i - u*), u* = c / (1 - a), u_0 = c
    u_star = c / (1 - a)
    expected = u_star + (c - u_star) * rate**k
    backward = eqattn.ImplicitAdjoint(
        eqattn.Picard(rtol=1e-12, atol=0.0, max_steps=k, damping=damping)
    )

    def loss(theta):
        eq = eqattn.fixed_point(
            lambda z, t: a * z + t,
            jnp.zeros(3),
            theta,
            solver=eqattn.Picard(rtol=1e-13, atol=0.0, max_steps=400),
            adjoint=backward,
        )
        return jnp.dot(jnp.asarray(c), eq.value)

    np.testing.assert_allclose(jax.grad(loss)(jnp.ones(3)), expected, rtol=1e-10)


def _numpy_anderson(f, x0, steps, m=5, ridge=1e-4):
    """Anderson type II in float64 (Walker and Ni's form, the ridge relative to the largest
    squared residual): the iterates x_0 .. x_steps."""
    xs, fs = [x0], [f(x0)]
    for _ in range(steps):
        g = np.stack([fx - x for x, fx in zip(xs[-m:], fs[-m:])])
        h = g @ g.T
        h += ridge * np.max(np.diag(h)) * np.eye(len(g))
        w = np.linalg.solve(h, np.ones(len(g)))
        xs.append((w / w.sum()) @ np.stack(fs[-m:]))
        fs.append(f(xs[-1]))
    return xs


def test_a_short_anderson_backward_returns_its_next_step(rng):
    """ImplicitAdjoint(Anderson(max_steps=k)) out of steps with its residuals still falling
    gives Anderson's next iterate u_k (float64 numpy reference) for u = g + J^T u: for f(z) =
    a z + theta and L = c . z*, the gradient is u itself. A converged backward gives the
    iterate that passed its test."""
    n, k = 6, 4
    q = np.linalg.qr(rng.normal(size=(n, n)))[0]
    a = q @ np.diag(np.linspace(0.1, 0.9, n)) @ q.T  # symmetric, a contraction
    c = rng.normal(size=n)
    h = lambda u: c + a.T @ u  # noqa: E731
    us = _numpy_anderson(h, c, k)  # the backward starts at u_0 = g = c
    residuals = [np.linalg.norm(h(u) - u) for u in us]
    assert all(r1 < r0 for r0, r1 in zip(residuals, residuals[1:k]))  # still improving

    def grad(linear):
        def loss(theta):
            eq = eqattn.fixed_point(
                lambda z, t: jnp.asarray(a) @ z + t,
                jnp.zeros(n),
                theta,
                solver=eqattn.Anderson(rtol=1e-13, atol=0.0, max_steps=100),
                adjoint=eqattn.ImplicitAdjoint(linear),
            )
            return jnp.dot(jnp.asarray(c), eq.value)

        return jax.grad(loss)(jnp.zeros(n))

    np.testing.assert_allclose(
        grad(eqattn.Anderson(rtol=1e-12, atol=0.0, max_steps=k)), us[k], rtol=1e-9
    )
    # converged within its budget: the iterate that passed the test (here the i-th)
    loose = eqattn.Anderson(rtol=1e-3, atol=0.0, max_steps=50)
    i = next(
        i
        for i, r in enumerate(_numpy_anderson(h, c, 50))
        if np.linalg.norm(h(r) - r) <= 1e-3 * np.linalg.norm(h(r))
    )
    np.testing.assert_allclose(grad(loose), _numpy_anderson(h, c, i)[i], rtol=1e-9)


def test_a_short_backward_under_vmap_stops_each_example_on_its_own(rng):
    """A short backward solve (a few steps, run as a loop of fixed length) under `vmap`: each
    example's gradient is its own float64 Anderson reference, whether it passed the test early
    (the iterate that passed) or ran out of steps (the next step)."""
    n, k, rtol = 6, 5, 1e-3
    q = np.linalg.qr(rng.normal(size=(n, n)))[0]
    cs = rng.normal(size=(3, n))
    # the spectra set how fast each example's backward converges: at once, early, not in k steps
    spectra = (np.full(n, 1e-4), np.linspace(0.01, 0.1, n), np.linspace(0.1, 0.9, n))
    mats = np.stack([q @ np.diag(s) @ q.T for s in spectra])
    expected, passed = [], []
    for a, c in zip(mats, cs):
        h = lambda u, a=a, c=c: c + a.T @ u  # noqa: E731
        us = _numpy_anderson(h, c, k)
        ok = [np.linalg.norm(h(u) - u) <= rtol * np.linalg.norm(h(u)) for u in us[:k]]
        passed.append(any(ok))
        expected.append(us[ok.index(True)] if any(ok) else us[k])
    assert passed == [True, True, False]
    backward = eqattn.ImplicitAdjoint(eqattn.Anderson(rtol=rtol, atol=0.0, max_steps=k))

    def grad(a, c):
        def loss(theta):
            eq = eqattn.fixed_point(
                lambda z, t: a @ z + t,
                jnp.zeros(n),
                theta,
                solver=eqattn.Anderson(rtol=1e-13, atol=0.0, max_steps=100),
                adjoint=backward,
            )
            return jnp.dot(c, eq.value)

        return jax.grad(loss)(jnp.zeros(n))

    got = jax.jit(jax.vmap(grad))(jnp.asarray(mats), jnp.asarray(cs))
    np.testing.assert_allclose(got, np.stack(expected), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "adjoint",
    [None, eqattn.ImplicitAdjoint(lx.GMRES(**TIGHT)), eqattn.Unrolled()],
    ids=["default", "GMRES", "Unrolled"],
)
def test_gradient_of_a_batch_loss_under_vmap_matches_closed_form(rng, solver, adjoint):
    """The users' pattern: the gradient of a loss summed over `vmap`ped examples, with respect
    to parameters shared by the batch (`w`) and per example (`theta`), against the closed form
    for z = tanh(W z + theta): with D = diag(1 - z^2) and the loss's gradient c,
    dL/dtheta = D (I - W^T D)^{-1} c and dL/dW = sum over examples of (dL/dtheta) z^T."""
    n, batch = 5, 4
    w = rng.normal(size=(n, n)) * 0.6 / np.sqrt(n)
    thetas = rng.normal(size=(batch, n))

    def loss(w, theta):
        eq = eqattn.fixed_point(
            lambda z, a: jnp.tanh(a[0] @ z + a[1]),
            jnp.zeros(n),
            (w, theta),
            solver=solver,
            adjoint=adjoint,
        )
        return jnp.sum(jnp.sin(eq.value))

    batch_loss = lambda w, t: jnp.sum(jax.vmap(loss, (None, 0))(w, t))  # noqa: E731
    gw, gt = jax.jit(jax.grad(batch_loss, argnums=(0, 1)))(jnp.asarray(w), jnp.asarray(thetas))
    expected_w, expected_t = np.zeros((n, n)), []
    for theta in thetas:
        z = np.zeros(n)
        for _ in range(500):
            z = np.tanh(w @ z + theta)
        d = np.diag(1 - z**2)
        g_theta = d @ np.linalg.solve(np.eye(n) - w.T @ d, np.cos(z))
        expected_t.append(g_theta)
        expected_w += np.outer(g_theta, z)
    np.testing.assert_allclose(gt, np.stack(expected_t), rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(gw, expected_w, rtol=1e-8, atol=1e-11)


def test_implicit_gradient_of_a_solve_cut_short(rng):
    """A Picard solve out of steps returns its last iterate x_{k-1} (the lowest residual) and its
    implicit gradient is linearized there, from the forward's last evaluation (no evaluation of
    its own): against the closed form in float64 for f(z) = tanh(W z + theta), L = sum(z*^2)."""
    n, k = 5, 3
    w = 0.4 * rng.normal(size=(n, n)) / np.sqrt(n)
    theta = rng.normal(size=n)
    f = lambda z: np.tanh(w @ z + theta)  # noqa: E731
    xs = [np.zeros(n)]
    for _ in range(k - 1):
        xs.append(f(xs[-1]))
    value = xs[-1]

    def implicit_at(x):
        d = 1 - f(x) ** 2  # tanh' at the linearization point
        return d * np.linalg.solve(np.eye(n) - (d[:, None] * w).T, 2 * value)

    expected = implicit_at(value)
    # a linearization one step further (at f(value), where the last evaluation went) differs:
    # the test can tell the two apart
    assert np.max(np.abs(implicit_at(f(value)) - expected)) > 1e-4

    backward = eqattn.ImplicitAdjoint(eqattn.Anderson(rtol=1e-13, atol=0.0, max_steps=50))

    def loss(theta):
        eq = eqattn.fixed_point(
            lambda z, t: jnp.tanh(jnp.asarray(w) @ z + t),
            jnp.zeros(n),
            theta,
            solver=eqattn.Picard(rtol=1e-12, atol=0.0, max_steps=k),
            adjoint=backward,
        )
        return jnp.sum(eq.value**2), eq.value

    (_, got_value), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(theta))
    np.testing.assert_allclose(got_value, value, rtol=1e-12)
    np.testing.assert_allclose(grad, expected, rtol=1e-9, atol=1e-12)


def test_backward_solve_failure_is_reported():
    """One `throw`: fixed_point's governs the backward solve unless the adjoint has its own."""
    args = problem()
    bad = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT))
    forward = eqattn.Anderson(**TIGHT)
    grad = eqx.filter_jit(jax.grad(lambda a: loss(a, forward, bad, throw=True)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
        jax.block_until_ready(grad(args))
    own = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT), throw=True)
    grad = eqx.filter_jit(jax.grad(lambda a: loss(a, forward, own, throw=False)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
        jax.block_until_ready(grad(args))
    # throw=False (the default) everywhere: the best-effort gradient, no error
    g = eqx.filter_jit(jax.grad(lambda a: loss(a, forward, bad)))(args)
    assert all(np.all(np.isfinite(x)) for x in g)
    lenient = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT), throw=False)
    g = eqx.filter_jit(jax.grad(lambda a: loss(a, forward, lenient, throw=True)))(args)
    assert all(np.all(np.isfinite(x)) for x in g)
    # Lineax's solvers, given as they are: their own verdict; a Krylov method and the normal
    # equations' CG
    for krylov in (
        lx.GMRES(max_steps=1, restart=1, **TIGHT),
        lx.Normal(lx.CG(max_steps=1, **TIGHT)),
    ):
        adjoint = eqattn.ImplicitAdjoint(linear_solver=krylov)
        grad = eqx.filter_jit(jax.grad(lambda a: loss(a, forward, adjoint, throw=True)))
        with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
            jax.block_until_ready(grad(args))
