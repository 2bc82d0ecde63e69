"""Solver backends (eqattn's, jaxopt's, Optimistix's), one `throw`, default backward accuracy,
`Equilibrium.result`, any pytree in `args`, the public adjoint protocol, precision-aware
defaults."""

import os
import subprocess
import sys
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

import eqattn
from eqattn._solve._precision import matmul_epsilon

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import jaxopt

N, D = 6, 4
TIGHT = 1e-12


def _problem(seed=0):
    """A contractive attention fixed point z = 0.3 attn(z Wq, z Wk, z Wv) + 0.5 x (float64)."""
    rng = np.random.default_rng(seed)
    weights = tuple(rng.normal(size=(D, D)) * 0.3 / np.sqrt(D) for _ in range(3))
    return weights + (rng.normal(size=(N, D)),)


def _f(z, args):
    wq, wk, wv, x = args
    return 0.3 * eqattn.attention(z @ wq, z @ wk, z @ wv) + 0.5 * x


def _numpy_fixed_point(args):
    """The reference: plain iteration in float64 numpy, to machine precision."""
    wq, wk, wv, x = (np.asarray(a) for a in args)
    z = np.zeros((N, D))
    for _ in range(200):
        q, k, v = z @ wq, z @ wk, z @ wv
        s = q @ k.T
        p = np.exp(s - s.max(-1, keepdims=True))
        z = 0.3 * (p / p.sum(-1, keepdims=True)) @ v + 0.5 * x
    return z


# Every kind of solver, at a tight tolerance, with `fixed_point`'s default adjoint.
TIGHT_SOLVERS = {
    "Anderson": eqattn.Anderson(rtol=TIGHT, atol=0.0, max_steps=100),
    "Picard": eqattn.Picard(rtol=TIGHT, atol=0.0, max_steps=100),
    "Broyden": eqattn.Broyden(rtol=TIGHT, atol=0.0, max_steps=100),
    "jaxopt.AndersonAcceleration": eqattn.JaxoptSolver(
        jaxopt.AndersonAcceleration, history_size=5, tol=TIGHT, maxiter=100
    ),
    "jaxopt.FixedPointIteration": eqattn.JaxoptSolver(
        jaxopt.FixedPointIteration, tol=TIGHT, maxiter=100
    ),
    "optx.FixedPointIteration": optx.FixedPointIteration(rtol=TIGHT, atol=TIGHT),
    "optx.BestSoFarFixedPoint": optx.BestSoFarFixedPoint(
        optx.FixedPointIteration(rtol=TIGHT, atol=TIGHT)
    ),
}


def _loss(args, solver, adjoint=None, throw=False):
    eq = eqattn.fixed_point(
        _f, jnp.zeros((N, D)), args, solver=solver, adjoint=adjoint, throw=throw, budget=100
    )
    return jnp.sum(jnp.sin(eq.value))


@pytest.mark.parametrize("name", list(TIGHT_SOLVERS))
def test_every_backend_solves_and_differentiates_to_the_solve_accuracy(name):
    """Value against float64 numpy; default-adjoint gradient against central differences to
    1e-8 relative (the backward solve takes the forward's tolerance)."""
    solver = TIGHT_SOLVERS[name]
    args = _problem()
    eq = jax.jit(lambda a: eqattn.fixed_point(_f, jnp.zeros((N, D)), a, solver=solver))(args)
    assert bool(eq.converged) and eq.result == eqattn.RESULTS.successful
    np.testing.assert_allclose(eq.value, _numpy_fixed_point(args), rtol=0, atol=1e-11)
    assert float(eq.residual) < 1e-10 and int(eq.steps) > 1

    grads = jax.jit(jax.grad(lambda a: _loss(a, solver)))(args)
    loss = jax.jit(lambda a: _loss(a, solver))
    # directional derivatives along random directions (so the central difference's rounding
    # floor, about eps |loss| / h, is far below 1e-8 of the derivative), relative to |g| |v|
    rng = np.random.default_rng(7)
    g_norm = np.sqrt(sum(np.sum(np.asarray(g) ** 2) for g in grads))
    h = 1e-4
    for _ in range(3):
        v = [rng.normal(size=np.shape(a)) for a in args]
        v_norm = np.sqrt(sum(np.sum(t**2) for t in v))
        shifted = [loss(tuple(a + sign * h * t for a, t in zip(args, v))) for sign in (1, -1)]
        fd = (shifted[0] - shifted[1]) / (2 * h)
        exact = sum(np.sum(np.asarray(g) * t) for g, t in zip(grads, v))
        assert abs(exact - fd) <= 1e-8 * g_norm * v_norm, (name, exact, fd)


@pytest.mark.parametrize("name", ["jaxopt.AndersonAcceleration", "optx.FixedPointIteration"])
def test_backends_under_vmap_match_eqattn(name):
    solver = TIGHT_SOLVERS[name]
    batch = [_problem(seed) for seed in range(3)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batch)

    def solve(a, s):
        return eqattn.fixed_point(_f, jnp.zeros((N, D)), a, solver=s, budget=100)

    ours = eqattn.Anderson(rtol=TIGHT, atol=0.0, max_steps=100)
    eq = jax.jit(jax.vmap(lambda a: solve(a, solver)))(stacked)
    ref = jax.jit(jax.vmap(lambda a: solve(a, ours)))(stacked)
    assert eq.steps.shape == (3,) and bool(jnp.all(eq.converged))
    np.testing.assert_allclose(eq.value, ref.value, atol=1e-11)
    grad = jax.jit(jax.vmap(jax.grad(lambda a: _loss(a, solver))))(stacked)
    grad_ref = jax.jit(jax.vmap(jax.grad(lambda a: _loss(a, ours))))(stacked)
    for g, r in zip(grad, grad_ref):
        np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-12)


def test_jaxopt_backend_with_an_eqattn_adjoint_and_its_errors():
    solver = TIGHT_SOLVERS["jaxopt.AndersonAcceleration"]
    args = _problem(1)
    ref = jax.grad(lambda a: _loss(a, TIGHT_SOLVERS["Anderson"]))(args)
    for adjoint in (
        eqattn.ImplicitAdjoint(),
        eqattn.ImplicitAdjoint(lx.GMRES(rtol=1e-12, atol=1e-12)),
    ):
        grads = jax.grad(lambda a: _loss(a, solver, adjoint))(args)
        for g, r in zip(grads, ref):
            np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="Unrolled"):
        _loss(args, solver, eqattn.Unrolled())
    with pytest.raises(ValueError, match="Python int"):
        jax.jit(lambda a, m: eqattn.fixed_point(_f, jnp.zeros((N, D)), a, solver=solver, budget=m))(
            args, 5
        )
    with pytest.raises(ValueError, match="jaxopt fixed-point solver class"):
        eqattn.JaxoptSolver(int)
    with pytest.raises(ValueError, match="fixed_point_fun"):
        eqattn.JaxoptSolver(jaxopt.FixedPointIteration, fixed_point_fun=_f)
    with pytest.raises(ValueError, match="bad options"):
        eqattn.JaxoptSolver(jaxopt.FixedPointIteration, history_size=3)
    with pytest.raises(ValueError, match="`solver` must be"):
        eqattn.fixed_point(_f, jnp.zeros((N, D)), args, solver=optx.BFGS(rtol=1e-3, atol=1e-3))


def test_jaxopt_is_imported_on_first_use():
    """`import eqattn` leaves jaxopt (and the scipy.optimize it pulls in) unimported, and
    warns of nothing (the tests above make `JaxoptSolver`s, which import it)."""
    code = (
        "import sys, warnings; warnings.simplefilter('error'); import eqattn; "
        "print(sorted(m for m in ('jaxopt', 'scipy.optimize') if m in sys.modules))"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_result_says_how_the_solve_ended():
    args = _problem()
    # per example under vmap: one converges, one runs out of steps, one meets NaN
    scales = jnp.array([1.0, 30.0, jnp.nan])

    def solve(c):
        f = lambda z, a: c * _f(z, a)  # noqa: E731
        return eqattn.fixed_point(f, jnp.zeros((N, D)), args, solver=eqattn.Picard(max_steps=8))

    eq = jax.vmap(solve)(scales)
    assert list(np.asarray(eq.converged)) == [True, False, False]
    assert bool((eq.result == eqattn.RESULTS.successful)[0])
    assert bool((eq.result == eqattn.RESULTS.max_steps_reached)[1])
    assert bool((eq.result == eqattn.RESULTS.nonfinite)[2])
    # the other backends report running out of steps too
    for solver in (
        eqattn.JaxoptSolver(jaxopt.FixedPointIteration, tol=TIGHT, maxiter=3),
        optx.FixedPointIteration(rtol=TIGHT, atol=TIGHT),
    ):
        eq = eqattn.fixed_point(_f, jnp.zeros((N, D)), args, solver=solver, budget=3)
        assert not bool(eq.converged) and eq.result == eqattn.RESULTS.max_steps_reached
        assert float(eq.residual) > TIGHT


def test_one_throw_for_forward_and_backward():
    """An unconverged forward with throw=False: value and gradient, no error (the gradient is
    the implicit one at the returned iterate). throw=True raises in the forward."""
    args = _problem()
    short = eqattn.Anderson(rtol=TIGHT, atol=0.0, max_steps=3)
    eq = eqattn.fixed_point(_f, jnp.zeros((N, D)), args, solver=short)
    assert not bool(eq.converged)
    grads = jax.jit(jax.grad(lambda a: _loss(a, short)))(args)
    assert all(np.all(np.isfinite(g)) for g in grads)
    with pytest.raises(eqx.EquinoxRuntimeError, match="did not converge"):
        jax.block_until_ready(eqx.filter_jit(lambda a: _loss(a, short, throw=True))(args))
    # a layer's throw reaches its backward solve too
    layer = eqattn.nn.ImplicitAttention(
        8,
        2,
        key=jax.random.key(0),
        solver=eqattn.Anderson(rtol=1e-10, atol=0.0, max_steps=40),
        adjoint=eqattn.ImplicitAdjoint(eqattn.Picard(rtol=1e-10, atol=0.0, max_steps=2)),
        throw=True,
    )
    x = jax.random.normal(jax.random.key(1), (5, 8))
    assert bool(layer.equilibrium(x).converged)
    grad = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="backward solve"):
        jax.block_until_ready(grad(layer))


def test_args_may_hold_any_pytree():
    """Functions, modules with activations and strings in `args`, and a custom layer holding an
    MLP: solved, and differentiated against finite differences."""
    mlp = eqx.nn.MLP(3, 3, 8, 2, activation=jax.nn.tanh, key=jax.random.key(0))
    mlp = jax.tree.map(lambda w: 0.3 * w if eqx.is_inexact_array(w) else w, mlp)
    x = jnp.asarray(np.random.default_rng(0).normal(size=3))

    def f(z, args):
        net, act, name, x = args
        assert name == "layer"
        return act(net(z) + x)

    def loss(net):
        eq = eqattn.fixed_point(
            f,
            jnp.zeros(3),
            (net, jnp.tanh, "layer", x),
            solver=eqattn.Anderson(rtol=TIGHT, atol=0.0),
        )
        return jnp.sum(eq.value**2)

    grads = eqx.filter_grad(loss)(mlp)
    w = mlp.layers[0].weight
    h = 1e-6
    bump = lambda d: eqx.tree_at(lambda m: m.layers[0].weight, mlp, w.at[1, 2].add(d))  # noqa: E731
    fd = (loss(bump(h)) - loss(bump(-h))) / (2 * h)
    np.testing.assert_allclose(grads.layers[0].weight[1, 2], fd, rtol=1e-6)

    class MLPLayer(eqattn.nn.AbstractEquilibriumLayer):
        mlp: eqx.nn.MLP
        solver: eqattn.AbstractFixedPointSolver
        adjoint: eqattn.AbstractAdjoint
        throw: bool

        def __init__(self, mlp):
            self.mlp = mlp
            self.solver = eqattn.Anderson(rtol=TIGHT, atol=0.0)
            self.adjoint = eqattn.ImplicitAdjoint()
            self.throw = True

        def forward(self, x):  # the convention: (output, Equilibrium); __call__ is inherited
            step = lambda self, z, x: jnp.tanh(self.mlp(z) + x)  # noqa: E731
            eq = self.solve(step, jnp.zeros_like(x), x)
            return eq.value, eq

    layer = MLPLayer(mlp)
    g = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    np.testing.assert_allclose(g.mlp.layers[0].weight, grads.layers[0].weight, rtol=1e-8)

    # An Optimistix root finder on g(z) = f(z) - z: Newton needs forward-mode derivatives of f,
    # which this f has (eqattn's attention is reverse-mode only, so not for attention maps).
    def newton_loss(net):
        eq = eqattn.fixed_point(
            f, jnp.zeros(3), (net, jnp.tanh, "layer", x), solver=optx.Newton(rtol=TIGHT, atol=TIGHT)
        )
        return jnp.sum(eq.value**2)

    g = eqx.filter_grad(newton_loss)(mlp)
    np.testing.assert_allclose(g.layers[0].weight, grads.layers[0].weight, rtol=1e-8)


class NeumannAdjoint(eqattn.AbstractAdjoint):
    """A user's adjoint written against the public protocol: a custom VJP whose backward sums
    `terms` terms of the Neumann series u = sum_i (J^T)^i g."""

    terms: int = eqx.field(static=True, default=60)

    def run(self, fn, params, x0, *, solve, throw):
        terms = self.terms
        # `params` may hold non-arrays (functions): differentiate its inexact arrays only
        dynamic, static = eqx.partition(params, eqx.is_inexact_array)
        f = lambda x, d: fn(x, eqx.combine(d, static))  # noqa: E731

        @jax.custom_vjp
        def value(d):
            return jax.lax.stop_gradient(solve(lambda x: f(x, d), x0).value)

        def fwd(d):
            x = value(d)
            return x, (x, d)

        def bwd(res, g):
            x, d = res
            _, jt = jax.vjp(lambda z: f(z, d), x)
            u = jax.lax.fori_loop(0, terms, lambda _, u: g + jt(u)[0], g)
            return jax.vjp(lambda d: f(x, d), d)[1](u)

        value.defvjp(fwd, bwd)
        eq = solve(lambda x: f(x, jax.lax.stop_gradient(dynamic)), x0)
        return eqx.tree_at(lambda e: e.value, eq, value(dynamic))


def test_a_user_adjoint_through_the_public_protocol():
    args = _problem(2)
    solver = eqattn.Anderson(rtol=TIGHT, atol=0.0, max_steps=100)
    grads = jax.jit(jax.grad(lambda a: _loss(a, solver, NeumannAdjoint())))(args)
    ref = jax.grad(lambda a: _loss(a, solver, eqattn.Unrolled()))(args)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-12)
    # ... and it runs with any backend's forward
    jaxopt_solver = TIGHT_SOLVERS["jaxopt.FixedPointIteration"]
    grads = jax.grad(lambda a: _loss(a, jaxopt_solver, NeumannAdjoint()))(args)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-12)


def test_precision_aware_default_tolerances():
    """The rule: layers' default rtol is max(rtol, 4 eps) with eps that of their matmuls."""
    assert matmul_epsilon(jnp.float64) == np.finfo(np.float64).eps
    assert matmul_epsilon(jnp.bfloat16) == 2.0**-7
    assert matmul_epsilon(jnp.float16) == 2.0**-10
    assert matmul_epsilon(jnp.float32) == 2.0**-23  # CPU's default
    for setting, eps in [
        ("tensorfloat32", 2.0**-10),
        ("high", 2.0**-10),
        ("bfloat16", 2.0**-7),
        ("highest", 2.0**-23),
        ("BF16_BF16_F32_X3", 2.0**-10),
    ]:
        with jax.default_matmul_precision(setting):
            assert matmul_epsilon(jnp.float32) == eps, setting
            block = eqattn.nn.DEQBlock(8, 2, key=jax.random.key(0), dtype=jnp.float32)
            assert block.solver.rtol == max(1e-3, 4 * eps)
    layer = eqattn.nn.ImplicitAttention(8, 2, key=jax.random.key(0), dtype=jnp.float32)
    assert layer.solver.rtol == 1e-4
    # bfloat16 parameters: the default solve converges and a training gradient does not raise,
    # even with throw=True (a bf16 evaluation cannot resolve a 1e-3 relative residual)
    block = eqattn.nn.DEQBlock(16, 2, key=jax.random.key(0), dtype=jnp.bfloat16, throw=True)
    assert block.solver.rtol == 4 * 2.0**-7
    x = jax.random.normal(jax.random.key(1), (3, 12, 16), jnp.bfloat16)
    eq = eqx.filter_jit(lambda b, x: jax.vmap(b.equilibrium)(x))(block, x)
    assert bool(jnp.all(eq.converged))
    loss = lambda m: jnp.sum(jax.vmap(m)(x).astype(jnp.float32) ** 2)  # noqa: E731
    grads = jax.block_until_ready(eqx.filter_jit(eqx.filter_grad(loss))(block))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


LAYER_BACKENDS = {
    # plain iteration: jaxopt's Anderson stalls near a 1e-4 residual on this Hopfield layer
    # (and says so: converged=False), where eqattn's converges in 40 steps
    "jaxopt.FixedPointIteration": eqattn.JaxoptSolver(
        jaxopt.FixedPointIteration, tol=TIGHT, maxiter=500
    ),
    "optx.FixedPointIteration": optx.FixedPointIteration(rtol=TIGHT, atol=TIGHT),
}


def test_every_layer_takes_any_backend():
    """ImplicitAttention, DEQBlock and Hopfield with a jaxopt / Optimistix solver: the same
    output and parameter gradients as with eqattn's Anderson (float64, tight)."""
    x = jax.random.normal(jax.random.key(1), (5, 8))
    y = jax.random.normal(jax.random.key(2), (7, 8))
    ours = eqattn.Anderson(rtol=TIGHT, atol=0.0, max_steps=200)
    makers = {
        "ImplicitAttention": lambda s: eqattn.nn.ImplicitAttention(
            8, 2, key=jax.random.key(0), solver=s
        ),
        "DEQBlock": lambda s: eqattn.nn.DEQBlock(8, 2, key=jax.random.key(0), solver=s),
        "Hopfield": lambda s: eqattn.nn.Hopfield(8, 8, 2, key=jax.random.key(0), solver=s),
    }
    for layer_name, make in makers.items():
        call = (lambda m: m(x, y)) if layer_name == "Hopfield" else (lambda m: m(x))
        loss = lambda m: jnp.sum(jnp.sin(call(m)))  # noqa: E731

        def solved(solver):
            layer = make(solver)
            return eqx.filter_jit(lambda m: (call(m), eqx.filter_grad(loss)(m)))(layer)

        out_ref, grads_ref = solved(ours)
        flat_ref = jax.tree.leaves(eqx.filter(grads_ref, eqx.is_inexact_array))
        for name, solver in LAYER_BACKENDS.items():
            out, grads = solved(solver)
            message = f"{layer_name}, {name}"
            np.testing.assert_allclose(out, out_ref, atol=1e-10, err_msg=message)
            flat = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
            for g, r in zip(flat, flat_ref, strict=True):
                np.testing.assert_allclose(g, r, rtol=1e-7, atol=1e-10, err_msg=message)
