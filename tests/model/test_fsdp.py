"""FSDP2 (gloo, 2 CPU ranks): each decoder layer and the root sharded with fully_shard give the unsharded model's
loss and gradients (tied embeddings, the case that shares a parameter across the root's modules), and the full
state dict gathered from the shards saves as a checkpoint equal to the unsharded model's."""

from __future__ import annotations

import pytest

from gloo_ranks import rank_results  # the plain-process launcher the other gloo tests share

pytestmark = pytest.mark.distributed

WORKER = """
import json, sys
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import load_checkpoint, save_state_dict
from align.utils.dist import exit_process

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
cfg = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
ref = MistralForCausalLM(cfg)
model = MistralForCausalLM(cfg)
model.load_state_dict(ref.state_dict())
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(1))  # same batch on both ranks

def loss_of(m):
    logits = m(ids)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

loss, ref_loss = loss_of(model), loss_of(ref)
loss.backward()
ref_loss.backward()
worst = abs(loss.item() - ref_loss.item())
for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
    worst = max(worst, (p.grad.full_tensor() - q.grad).abs().max().item())
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
same = None
if rank == 0:
    full.pop("lm_head.weight", None)
    out = save_state_dict(full, cfg, sys.argv[1])
    loaded = load_checkpoint(out)
    same = all(torch.equal(v, ref.state_dict()[k]) for k, v in loaded.state_dict().items())
print(json.dumps({"rank": rank, "worst": worst, "same": same,
                  "dtensor": type(model.model.layers[0].mlp.up_proj.weight).__name__}))
exit_process(0)  # not a plain exit: gloo's threads can abort a finished rank at finalisation (docs/RELIABILITY.md)
"""


def test_fully_shard_per_layer_matches_unsharded(tmp_path):
    results = rank_results(WORKER, tmp_path, 2, str(tmp_path / "ck"))
    for r in results:
        assert r["dtensor"] == "DTensor" and r["worst"] <= 1e-6
    assert [r["same"] for r in results if r["rank"] == 0] == [True]
