"""Run TRL 0.24's real `PPOTrainer.train()` for one rollout on tiny random Mistral models and save the tensors its GAE,
whitening and losses saw (tests/ppo/test_trl024_ppo_oracle.py compares align's functions with them).

    python tests/ppo/trl024_ppo_run.py TRL_DIR OUT.pt

TRL_DIR (TRL 0.24.0 installed with --no-deps, scripts/_venv.sh align_trl_ppo_oracle) goes first on sys.path, so it
shadows the venv's newer TRL in this process only; transformers, accelerate and datasets are the venv's.

Nothing of TRL's computation is replaced. Two module-level names of `trl.trainer.ppo_trainer` are wrapped:
`masked_whiten` and `masked_mean` (its `from ..core import ...`), each calling TRL's own function unchanged. At each
call from `PPOTrainer.train()` the wrapper reads train()'s local variables from the calling frame (TRL's own tensors
by their names in its source: rewards, values, advantages, returns, padding masks, vpred, new_logprobs, ...) and
clones them. At the policy-loss call it also takes the gradients of TRL's pg_loss and vf_loss with respect to TRL's
new_logprobs and vpred (retain_graph: TRL's own backward that follows is unaffected)."""

from __future__ import annotations

import os
import sys
import tempfile


def main(trl_dir: str, out_path: str) -> None:
    sys.path.insert(0, os.path.abspath(trl_dir))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(1)
    import trl
    import trl.trainer.ppo_trainer as ppo_mod
    from datasets import Dataset
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import (MistralConfig, MistralForCausalLM, MistralForSequenceClassification,
                              PreTrainedTokenizerFast)

    if trl.__version__ != "0.24.0" or not os.path.abspath(trl.__file__).startswith(os.path.abspath(trl_dir)):
        raise SystemExit(f"expected TRL 0.24.0 from {trl_dir}, imported {trl.__version__} from {trl.__file__}")

    # A 12-token vocabulary: with a random policy EOS is sampled often enough that most rows end inside the
    # 8-token response window and some run to its end (both of TRL's end cases).
    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(9)]
    vocab = {w: i for i, w in enumerate(words)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
                                  pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left")
    cfg = MistralConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                        pad_token_id=vocab["<pad>"], eos_token_id=vocab["<eos>"], bos_token_id=None,
                        tie_word_embeddings=False, num_labels=1)
    torch.manual_seed(0)
    policy, ref = MistralForCausalLM(cfg), MistralForCausalLM(cfg)
    value_model, reward_model = MistralForSequenceClassification(cfg), MistralForSequenceClassification(cfg)
    ref.load_state_dict(policy.state_dict())
    with torch.no_grad():
        ref.lm_head.weight.add_(0.02 * torch.randn_like(ref.lm_head.weight))  # a KL term that is not zero
        reward_model.score.weight.mul_(20.0)  # scores and values of order 1 (a random head's are ~0.1)
        value_model.score.weight.mul_(10.0)

    g = torch.Generator().manual_seed(1)
    queries = torch.randint(3, len(words), (16, 4), generator=g).tolist()  # equal length: no query padding
    train = Dataset.from_dict({"input_ids": queries[:8]})
    evals = Dataset.from_dict({"input_ids": queries[8:]})

    calls: list[dict] = []
    real_mean, real_whiten = ppo_mod.masked_mean, ppo_mod.masked_whiten

    def snap(frame_locals: dict, names: tuple[str, ...]) -> dict:
        return {n: frame_locals[n].detach().clone() for n in names if torch.is_tensor(frame_locals.get(n))}

    def whiten_spy(values, mask, shift_mean=True):
        out = real_whiten(values, mask, shift_mean=shift_mean)
        f = sys._getframe(1)
        if f.f_code.co_name == "train":
            loc = f.f_locals
            which = "rewards" if values is loc.get("rewards") else "advantages" if values is loc.get(
                "advantages") else "?"
            calls.append({"fn": "masked_whiten", "which": which, "x": values.detach().clone(),
                          "mask": mask.clone(), "shift_mean": shift_mean, "out": out.detach().clone(),
                          **snap(loc, ("values", "rewards", "returns", "padding_mask", "padding_mask_p1",
                                       "sequence_lengths", "scores", "logprobs", "ref_logprobs",
                                       "postprocessed_responses"))})
        return out

    def mean_spy(values, mask, axis=None):
        out = real_mean(values, mask, axis)
        f = sys._getframe(1)
        if f.f_code.co_name != "train":
            return out
        loc = f.f_locals
        rec = {"fn": "masked_mean", "which": "?", "x": values.detach().clone(), "mask": mask.clone(),
               "out": out.detach().clone()}
        if values is loc.get("vf_loss_max"):
            rec["which"] = "vf_loss"
            rec.update(snap(loc, ("vpred", "mb_values", "mb_return")))
        elif values is loc.get("pg_loss_max"):
            rec["which"] = "pg_loss"
            rec.update(snap(loc, ("new_logprobs", "mb_logprobs", "mb_advantage", "vf_loss", "vf_clipfrac",
                                  "advantages", "returns", "values")))
            rec["pg_grad"], = torch.autograd.grad(out, loc["new_logprobs"], retain_graph=True)
            rec["vf_grad"], = torch.autograd.grad(loc["vf_loss"], loc["vpred"], retain_graph=True)
        calls.append(rec)
        return out

    ppo_mod.masked_whiten, ppo_mod.masked_mean = whiten_spy, mean_spy

    with tempfile.TemporaryDirectory() as tmp:
        args = ppo_mod.PPOConfig(
            output_dir=tmp, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=4, gradient_accumulation_steps=2, num_mini_batches=1,
            num_ppo_epochs=2, total_episodes=8, response_length=8, local_rollout_forward_batch_size=8,
            stop_token="eos", missing_eos_penalty=1.0, whiten_rewards=True, kl_coef=0.05, kl_estimator="k1",
            gamma=0.9, lam=0.8, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
            learning_rate=0.05, temperature=1.0, num_sample_generations=0, seed=3, use_cpu=True)
        trainer = ppo_mod.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref,
                                     reward_model=reward_model, value_model=value_model, train_dataset=train,
                                     eval_dataset=evals)
        import numpy as np

        np.random.seed(0)  # TRL draws each PPO epoch's micro-batch order from numpy's global RNG (torch is seeded)
        trainer.train()
    torch.save({"trl_version": trl.__version__, "gamma": args.gamma, "lam": args.lam, "cliprange": args.cliprange,
                "cliprange_value": args.cliprange_value, "eos_id": vocab["<eos>"], "calls": calls}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
