"""The Pallas log-prob kernel under context parallelism: each context shard scores its own
positions (the kernel's shard_map splits them over context as the activations are), so
no chip gathers the whole sequence of hidden states; the log-probs equal context 1's."""
import dataclasses
import re

import jax
import numpy as np

from cached_params import params_on
from packed_rows import packed_rows
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl import packing
from jaxrl_reason.rl.update import make_packed_logprob_fn
from jaxrl_reason.runtime import sharding as shd
from numerics import decoder_tolerance

RULES = shd.DEFAULT_RULES
T = 40  # tokens per pack: 10 per context shard at context 4


def test_pallas_logprobs_split_positions_over_context():
    cfg = dataclasses.replace(get_preset("test"), vocab_size=64, attention_impl="reference",
                              logprobs_impl="pallas")
    model = Transformer(cfg)
    prompt, valid, completion, lengths, _ = packed_rows(0, 64, 4, 4, 6, 11)
    counts = packing.pack_buckets(packing.max_packs(len(completion), 16, T), 2)
    host = packing.pack(prompt, valid, completion, lengths, T, counts).arrays()
    rows = len(host["pack_tokens"])
    out = []
    for mesh in (shd.make_mesh({"data": 2}, jax.devices()[:2]),
                 shd.make_mesh({"data": 2, "context": 4})):
        params = params_on(cfg, mesh)
        packs = {k: shd.put_batch(mesh, RULES, v) for k, v in host.items()}
        fn = make_packed_logprob_fn(model, 0.7, True, mesh, RULES).lower(params, packs)
        compiled = fn.compile()
        if mesh.shape["context"] > 1:
            gathers = re.findall(r"= (\S+\[[\d,]*\])\S* all-gather\(", compiled.as_text())
            # no chip rebuilds a pack's whole sequence of hidden states for the kernel
            whole = f"[{rows // 2},{T},{cfg.d_model}]"
            assert not any(s.endswith(whole) for s in gathers), gathers
        out.append(np.asarray(compiled(params, packs)))
    atol = decoder_tolerance(cfg, params, tokens=T, temperature=0.7)
    assert np.abs(out[0]).max() > 100 * atol
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=atol)
