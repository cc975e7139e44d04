"""Tessera inside the pipelines people run.

:mod:`tessera.integrations.methods` holds the published sparse-attention methods as ready
configurations (no optional dependency); :mod:`tessera.integrations.diffusers` turns them on for
a diffusers video transformer in one call (needs torch and diffusers: ``pip install
'tessera-attention[diffusers]'``); :mod:`tessera.integrations.distributed` splits one attention's
sequence across the ranks of a torch.distributed group;
:mod:`tessera.integrations.jax_attention` makes the attention differentiable under ``jax.grad``
(eager). Nothing here is imported by ``import tessera``.
"""
