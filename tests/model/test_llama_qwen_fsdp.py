"""FSDP2 (gloo, 2 CPU ranks) on Llama 3, Qwen 2 and Qwen 3: each decoder layer and the root sharded with
fully_shard, every rank on its own half of the batch, give the one-process model's loss, gradients (biases and
per-head q/k norms included, tied embeddings) and weights after an SGD step; the full state dict gathered from
the shards saves as a checkpoint that loads back as that family's model with the one-process weights."""

from __future__ import annotations

import pytest

from gloo_ranks import rank_results

pytestmark = pytest.mark.distributed

WORKER = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
sys.path.insert(0, "tests/model")
from dense_helpers import dense_model
from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.utils.dist import exit_process

dist.init_process_group("gloo")
rank = dist.get_rank()
results = {}
for family in ("llama", "qwen2", "qwen3"):
    ref = dense_model(family, seed=3, tie_word_embeddings=True).train()
    model = dense_model(family, seed=3, tie_word_embeddings=True).train()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ids = torch.randint(0, ref.config.vocab_size, (4, 70), generator=torch.Generator().manual_seed(1))
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))

    def loss_of(m, rows):  # mean over the rows' predicted tokens
        logits = m(rows)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), rows[:, 1:].flatten())

    loss = loss_of(model, ids[2 * rank:2 * rank + 2])  # this rank's half; FSDP averages the gradients over ranks
    loss.backward()
    ref_loss = loss_of(ref, ids)
    ref_loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    total /= 2
    worst = abs(total.item() - ref_loss.item())
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        worst = max(worst, (p.grad.full_tensor() - q.grad).abs().max().item())
    opt.step()
    ref_opt.step()
    step = max((p.full_tensor() - q).abs().max().item()
               for p, q in zip(model.parameters(), ref.parameters()))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    same = None
    if rank == 0:
        ref.load_state_dict(full)  # the sharded run's weights in a plain model, saved as the family's checkpoint
        loaded = load_checkpoint(save_checkpoint(ref, sys.argv[1] + "/" + family))
        same = type(loaded) is type(ref) and all(torch.equal(v, full[k]) for k, v in loaded.state_dict().items())
    results[family] = {"worst": worst, "step": step, "same": same,
                       "dtensor": type(model.model.layers[0].self_attn.q_proj.weight).__name__}
print(json.dumps({"rank": rank, "results": results}))
exit_process(0)  # not a plain exit: gloo's threads can abort a finished rank at finalisation (docs/RELIABILITY.md)
"""


def test_fully_shard_equals_one_process(tmp_path):
    results = rank_results(WORKER, tmp_path, 2, str(tmp_path / "ck"))
    for r in results:
        assert sorted(r["results"]) == ["llama", "qwen2", "qwen3"]
        for family, res in r["results"].items():
            assert res["dtensor"] == "DTensor", family
            assert res["worst"] <= 1e-6 and res["step"] <= 1e-6, (family, res)
            if r["rank"] == 0:
                assert res["same"] is True, family
