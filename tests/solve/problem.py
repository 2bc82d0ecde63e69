"""The problem the solving tests share: a contractive attention fixed point, its loss, central
differences, and the solvers and exact adjoints to run on it."""

import jax.numpy as jnp
import lineax as lx
import numpy as np

import eqattn

N, D = 6, 4
TIGHT = dict(rtol=1e-12, atol=0.0)


def problem(seed=0):
    """A contractive attention fixed point z = 0.3 attn(z Wq, z Wk, z Wv) + 0.5 x."""
    rng = np.random.default_rng(seed)
    weights = tuple(rng.normal(size=(D, D)) * 0.3 / np.sqrt(D) for _ in range(3))
    x = rng.normal(size=(N, D))
    return weights + (x,)


def f(z, args):
    wq, wk, wv, x = args
    return 0.3 * eqattn.attention(z @ wq, z @ wk, z @ wv) + 0.5 * x


def loss(args, solver, adjoint, throw=False):
    eq = eqattn.fixed_point(f, jnp.zeros((N, D)), args, solver=solver, adjoint=adjoint, throw=throw)
    return jnp.sum(jnp.sin(eq.value))


def central_difference(fn, args, index, entry, h=1e-6):
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
