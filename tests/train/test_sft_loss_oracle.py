"""Oracle: align's SFT loss (fused head, labels shifted here) equals transformers' MistralForCausalLM loss with the
same weights and the same input-aligned labels, value and gradients."""

import dataclasses

import pytest
import torch

from align.train.sft_loss import SftLossConfig, sft_loss
from train_helpers import sft_batch, tiny_model

pytestmark = pytest.mark.oracle


def test_sft_loss_and_gradients_equal_transformers_causal_lm_loss():
    transformers = pytest.importorskip("transformers")
    model = tiny_model(seed=4)
    fields = {k: v for k, v in dataclasses.asdict(model.config).items() if k != "rope_theta"}
    hf_cfg = transformers.MistralConfig(**fields, rope_parameters={"rope_type": "default",
                                                                   "rope_theta": model.config.rope_theta})
    twin = transformers.MistralForCausalLM(hf_cfg).eval()
    twin.load_state_dict(model.state_dict())
    model.eval()
    batch = sft_batch(4, 20)
    ours = sft_loss(model, batch, SftLossConfig(chunk_size=8))
    (ours.loss / ours.sums["tokens"]).backward()
    theirs = twin(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long(),
                  labels=batch["labels"]).loss
    theirs.backward()
    torch.testing.assert_close((ours.sums["ce_sum"] / ours.sums["tokens"]), theirs.detach(), rtol=1e-5, atol=1e-6)
    grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
