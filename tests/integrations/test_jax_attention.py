"""tessera.integrations.jax_attention: bad input refused by name before JAX is asked for anything
(CPU), and jax.grad through Tessera's attention equal to the float64 reference's gradients
(GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import BlockMask, reference
from tessera.integrations import jax_attention

M = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)


def test_bad_input_is_refused_by_name():
    x = np.zeros((1, 1, 128, 64), np.float32)
    with pytest.raises(TypeError, match="block_mask must be a tessera.BlockMask"):
        jax_attention.attention(x, x, x, np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="scale must be positive"):
        jax_attention.attention(x, x, x, M, scale=0.0)
    with pytest.raises(ValueError, match="layout must be 'bhld' or 'blhd'"):
        jax_attention.attention(x, x, x, M, layout="bshd")


@pytest.mark.gpu
def test_jax_grad_equals_the_reference():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from tests.gpu.test_gpu_backward import _ragged_mask, check_gradients

    rng = np.random.default_rng(3)
    mask = _ragged_mask(rng, 2)
    shape = lambda h: (1, 512, h, 64)  # noqa: E731 (blhd)
    q, k, v = (jnp.asarray(rng.standard_normal(shape(h)), dtype=jnp.bfloat16)
               for h in (4, 2, 2))
    w = jnp.asarray(rng.standard_normal(shape(4)), dtype=jnp.bfloat16)

    def loss(q, k, v):
        out = jax_attention.attention(q, k, v, mask, layout="blhd")
        return (out.astype(jnp.float32) * w.astype(jnp.float32)).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    exact = [np.asarray(x.astype(jnp.float32)).astype(np.float64) for x in (q, k, v, w)]
    want = reference.attention_backward(*exact, mask, layout="blhd")
    for g, ref, name in zip(grads, want, ("dq", "dk", "dv")):
        assert g.dtype == jnp.bfloat16, name
        check_gradients(g, ref, "bfloat16", name)
