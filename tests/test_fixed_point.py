import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import eqattn

N, D = 6, 4
TIGHT = dict(rtol=1e-12, atol=0.0)


def _problem(seed=0):
    """A contractive attention fixed point z = 0.3 attn(z Wq, z Wk, z Wv) + 0.5 x."""
    rng = np.random.default_rng(seed)
    weights = tuple(rng.normal(size=(D, D)) * 0.3 / np.sqrt(D) for _ in range(3))
    x = rng.normal(size=(N, D))
    return weights + (x,)


def _f(z, args):
    wq, wk, wv, x = args
    return 0.3 * eqattn.attention(z @ wq, z @ wk, z @ wv) + 0.5 * x


def _loss(args, solver, adjoint, throw=False):
    eq = eqattn.fixed_point(
        _f, jnp.zeros((N, D)), args, solver=solver, adjoint=adjoint, throw=throw
    )
    return jnp.sum(jnp.sin(eq.value))


def _central_difference(fn, args, index, entry, h=1e-6):
    def shifted(sign):
        a = list(args)
        a[index] = a[index].copy()
        a[index][entry] += sign * h
        return fn(tuple(a))

    return (shifted(1) - shifted(-1)) / (2 * h)


SOLVERS = [eqattn.Picard(**TIGHT), eqattn.Anderson(**TIGHT), eqattn.Broyden(**TIGHT)]
EXACT_ADJOINTS = [
    eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(**TIGHT, max_steps=100)),
    eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT)),
    eqattn.ImplicitAdjoint(linear_solver=eqattn.Broyden(**TIGHT)),
    eqattn.ImplicitAdjoint(linear_solver=lx.GMRES(**TIGHT)),
    eqattn.ImplicitAdjoint(linear_solver=lx.BiCGStab(**TIGHT)),
    eqattn.ImplicitAdjoint(linear_solver=lx.Normal(lx.CG(**TIGHT))),
    eqattn.Unrolled(),
]


def test_the_problem_is_contractive(getkey):
    args = _problem()
    eq = eqattn.fixed_point(_f, jnp.zeros((N, D)), args, solver=eqattn.Picard(**TIGHT))
    assert eq.converged and 8 <= eq.steps <= 20
    rho = eqattn.spectral_radius(_f, eq.value, args, key=getkey(), steps=50)
    jac = jax.jacrev(lambda z: _f(z, args))(eq.value).reshape(N * D, N * D)
    exact = np.max(np.abs(np.linalg.eigvals(jac)))
    assert exact < 0.2
    np.testing.assert_allclose(rho, exact, rtol=1e-3)


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(
    "adjoint", EXACT_ADJOINTS, ids=lambda a: type(getattr(a, "linear_solver", a)).__name__
)
def test_gradient_matches_finite_differences(solver, adjoint):
    args = _problem()
    grads = jax.jit(jax.grad(lambda a: _loss(a, solver, adjoint)))(args)
    loss = jax.jit(lambda a: _loss(a, solver, adjoint))
    for index, entry in [(0, (1, 2)), (1, (3, 0)), (2, (2, 2)), (3, (4, 1))]:
        fd = _central_difference(loss, args, index, entry)
        np.testing.assert_allclose(grads[index][entry], fd, rtol=1e-6, atol=1e-9)


def test_unrolled_matches_implicit():
    args = _problem(1)
    tight = eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT))
    implicit = jax.grad(lambda a: _loss(a, eqattn.Anderson(**TIGHT), tight))(args)
    unrolled = jax.grad(lambda a: _loss(a, eqattn.Anderson(**TIGHT), eqattn.Unrolled()))(args)
    for a, b in zip(implicit, unrolled):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)


def test_phantom_tends_to_the_implicit_gradient():
    args = _problem(2)
    solver = eqattn.Anderson(**TIGHT)
    tight = eqattn.ImplicitAdjoint(linear_solver=eqattn.Anderson(**TIGHT))
    exact = jax.grad(lambda a: _loss(a, solver, tight))(args)

    def error(adjoint):
        g = jax.grad(lambda a: _loss(a, solver, adjoint))(args)
        return sum(float(jnp.linalg.norm(a - b)) for a, b in zip(g, exact))

    errors = [error(eqattn.Phantom(steps=k)) for k in (1, 2, 4, 8)]
    assert all(b < a * 0.5 for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-6
    # JacobianFree is the one-step phantom gradient: biased, but correlated with the exact one.
    jfb = error(eqattn.JacobianFree())
    np.testing.assert_allclose(jfb, errors[0], rtol=1e-10)
    assert 0 < jfb < sum(float(jnp.linalg.norm(g)) for g in exact)


def test_forward_value_does_not_depend_on_the_adjoint():
    args = _problem()
    values = [
        eqattn.fixed_point(_f, jnp.zeros((N, D)), args, adjoint=adj).value
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
    args = _problem()
    broyden = eqattn.Broyden(**TIGHT)
    exact = jax.grad(_loss)(args, broyden, eqattn.ImplicitAdjoint(eqattn.Picard(**TIGHT)))

    def error(adjoint):
        g = jax.grad(_loss)(args, broyden, adjoint)
        return max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(g, exact))

    free, refined = error(eqattn.SharedInverse()), error(eqattn.SharedInverse(refine=3))
    assert refined < 1e-4 < free < error(eqattn.JacobianFree())
    assert free < 0.2
    with pytest.raises(ValueError, match="must be eqattn.Broyden"):
        _loss(args, eqattn.Anderson(), eqattn.SharedInverse())
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
    args = _problem()
    xs = np.stack([args[3] * s for s in (0.0, 1.0, 3.0)])

    def solve(x):
        return eqattn.fixed_point(
            _f, jnp.zeros((N, D)), args[:3] + (x,), solver=eqattn.Picard(**TIGHT)
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
    args = _problem()
    xs = np.stack([args[3] * s for s in (0.0, 1.0, 3.0)])

    def solve(x, check_every, budget=None):
        solver = kind(**TIGHT, check_every=check_every)
        adjoint = eqattn.ImplicitAdjoint(linear_solver=kind(**TIGHT, check_every=check_every))
        eq = eqattn.fixed_point(
            _f,
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
    args = tuple(jnp.asarray(a, jnp.bfloat16) for a in _problem())
    for solver in (eqattn.Anderson(rtol=1e-2), eqattn.Picard(rtol=1e-2)):
        eq = eqattn.fixed_point(_f, jnp.zeros((N, D), jnp.bfloat16), args, solver=solver)
        assert eq.value.dtype == jnp.bfloat16 and eq.converged
        ref = eqattn.fixed_point(
            _f,
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


def test_non_contractive_is_reported():
    f = lambda z, _: 2 * z + 1  # noqa: E731
    eq = eqattn.fixed_point(f, jnp.zeros(3), solver=eqattn.Picard(max_steps=10))
    assert not eq.converged
    assert int(eq.steps) == 10
    # the lowest-residual iterate (here the start, |f(0) - 0| = sqrt(3)) is returned
    np.testing.assert_allclose(eq.value, 0.0)
    np.testing.assert_allclose(eq.residual, np.sqrt(3))
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


def test_backward_solve_failure_is_reported():
    """One `throw`: fixed_point's governs the backward solve unless the adjoint has its own."""
    args = _problem()
    bad = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT))
    forward = eqattn.Anderson(**TIGHT)
    grad = eqx.filter_jit(jax.grad(lambda a: _loss(a, forward, bad, throw=True)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
        jax.block_until_ready(grad(args))
    own = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT), throw=True)
    grad = eqx.filter_jit(jax.grad(lambda a: _loss(a, forward, own, throw=False)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
        jax.block_until_ready(grad(args))
    # throw=False (the default) everywhere: the best-effort gradient, no error
    g = eqx.filter_jit(jax.grad(lambda a: _loss(a, forward, bad)))(args)
    assert all(np.all(np.isfinite(x)) for x in g)
    lenient = eqattn.ImplicitAdjoint(linear_solver=eqattn.Picard(max_steps=2, **TIGHT), throw=False)
    g = eqx.filter_jit(jax.grad(lambda a: _loss(a, forward, lenient, throw=True)))(args)
    assert all(np.all(np.isfinite(x)) for x in g)
    # Lineax's solvers, given as they are: their own verdict; a Krylov method and the normal
    # equations' CG (eqattn's deprecated wrappers of them still run, with a warning)
    with pytest.warns(DeprecationWarning, match="lx.GMRES"):
        wrapped = eqattn.GMRES(max_steps=1, restart=1, **TIGHT)
    for krylov in (
        lx.GMRES(max_steps=1, restart=1, **TIGHT),
        lx.Normal(lx.CG(max_steps=1, **TIGHT)),
        wrapped,
    ):
        adjoint = eqattn.ImplicitAdjoint(linear_solver=krylov)
        grad = eqx.filter_jit(jax.grad(lambda a: _loss(a, forward, adjoint, throw=True)))
        with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
            jax.block_until_ready(grad(args))


def test_warm_start_and_step_budget_without_recompiling():
    args = _problem()
    traces = []

    @jax.jit
    def solve(z0, budget):
        traces.append(None)
        return eqattn.fixed_point(_f, z0, args, solver=eqattn.Picard(**TIGHT), budget=budget)

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
    args = _problem()

    def loss(args, start):
        z0 = start(args)
        eq = eqattn.fixed_point(_f, z0, args, solver=eqattn.Anderson(**TIGHT), adjoint=adjoint)
        return jnp.sum(jnp.sin(eq.value))

    from_params = jax.grad(loss)(args, lambda a: a[3] @ a[0])
    from_zeros = jax.grad(loss)(args, lambda a: jnp.zeros((N, D)))
    for a, b in zip(from_params, from_zeros):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)


def test_jacobian_frobenius_is_unbiased(getkey):
    args = _problem()
    z = jnp.asarray(np.random.default_rng(5).normal(size=(N, D)))
    exact = np.sum(np.asarray(jax.jacrev(lambda z: _f(z, args))(z)) ** 2)
    est = eqattn.jacobian_frobenius(_f, z, args, key=getkey(), samples=4000)
    np.testing.assert_allclose(est, exact, rtol=0.05)
    # differentiable with respect to the parameters
    penalty = lambda a: eqattn.jacobian_frobenius(_f, z, a, key=jax.random.key(0))  # noqa: E731
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
