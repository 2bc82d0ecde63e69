"""The layers the tests of `eqattn.nn` share: each equilibrium layer at a tight tolerance, in
float64."""

import equinox as eqx
import jax
import jax.numpy as jnp

import eqattn
import eqattn.nn as enn

F64 = jnp.float64
TIGHT = dict(rtol=1e-11, atol=0.0)


def tight_adjoint():
    return eqattn.ImplicitAdjoint(
        linear_solver=eqattn.Anderson(**TIGHT, max_steps=300, history_size=8)
    )


def layers(key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    solver = eqattn.Anderson(**TIGHT, max_steps=200)
    return {
        "ImplicitAttention": enn.ImplicitAttention(8, 2, key=k1, solver=solver, dtype=F64),
        "DEQBlock": enn.DEQBlock(8, 2, key=k2, solver=solver, dtype=F64),
        # a cell of two untied blocks (the second without the injection)
        "DEQBlock cell": enn.DEQBlock(8, 2, key=k2, solver=solver, depth=2, dtype=F64),
        # the attention reads the state plus the injection
        "DEQBlock attend_input": enn.DEQBlock(
            8, 2, key=k2, solver=solver, attend_input=True, dtype=F64
        ),
        "Hopfield": enn.Hopfield(8, 6, 2, key=k3, solver=solver, dtype=F64),
        "EnergyAttention": enn.EnergyAttention(
            8, 2, key=k4, num_memories=4, solver=eqattn.Picard(**TIGHT, max_steps=400), dtype=F64
        ),
    }


def apply(name, layer, x, y):
    return layer(x, y) if name == "Hopfield" else layer(x)


def with_adjoint(layer, adjoint):
    return eqx.tree_at(lambda m: m.adjoint, layer, adjoint)
