"""Oracle: align's GAE, whitening, clipped value loss and clipped policy loss equal TRL 0.24's PPOTrainer on the
tensors of a real rollout, to 1e-6 (values and gradients).

TRL 1.x (the venv's, the `oracle` extra) has no PPO trainer; TRL 0.24.0 is the last that ships one. scripts/test.sh
installs its pure-python wheel with --no-deps into `.oracle/trl-0.24` (scripts/_venv.sh `align_trl_ppo_oracle`),
and tests/ppo/trl024_ppo_run.py runs it in a subprocess with that directory first on sys.path (the venv's
transformers, accelerate and datasets): `PPOTrainer.train()` itself, one rollout of 8 prompts x 8 sampled tokens on
tiny random Mistral policy / reference / reward / value models, two PPO epochs of two micro-batches. TRL's own
intermediate tensors are read from train()'s frame at its `masked_whiten` / `masked_mean` calls (see the driver);
nothing of TRL is copied or replaced.

TRL's masks, mapped as they are (no bending). With L_i = TRL's `sequence_lengths` (index of the last response
token: the EOS when the row stopped, T - 1 when it ran to the window's end; a sampled pad token also ends a row):
  - `padding_mask` (positions > L_i) is the response mask: the policy loss and the advantage whitening use ~it;
  - `padding_mask_p1` (positions > L_i + 1) is the value mask: TRL keeps ONE MORE position after the response, the
    state after the EOS, whose value V(s_{L+1}) the critic predicts and the value loss trains, and the score is
    added there (`actual_end` = L_i + 1), not on the EOS token. GAE runs over the whole window with rewards and
    values zero outside ~p1, which is align's `gae(rewards, values, mask=~padding_mask_p1)` exactly (align's
    recursion treats the first position after the mask as terminal).
align's PPO stage has its own convention (align/rl/ppo/rewards.py, batch_source.py): the score sits on the last sampled
token (the EOS) and V after it is 0, i.e. the same recursion with the mask ending at L_i. The two agree only for
gamma = lam = 1; otherwise TRL's A_L = r_L + gamma V_{L+1} - V_L + gamma lam (s - V_{L+1}) bootstraps from the
critic's guess of the finished state where align's A_L = r_L + s - V_L. That is a design difference between the two
trainers, not a difference in the functions tested here; `test_trl_masks_one_position_past_the_response` pins
TRL's side of it so a change in TRL's convention fails loudly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.rl.ppo.gae import gae, whiten
from align.rl.ppo.loss import policy_loss, value_loss

pytestmark = pytest.mark.oracle

ROOT = Path(__file__).resolve().parents[2]
TRL_DIR = ROOT / ".oracle" / "trl-0.24"
DRIVER = Path(__file__).with_name("trl024_ppo_run.py")
TOL = 1e-6


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a.double() - b.double()).abs().max()) <= TOL


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not (TRL_DIR / "trl" / "__init__.py").is_file():
        pytest.skip(f"TRL 0.24.0 is not installed at {TRL_DIR}: `bash scripts/test.sh` installs it, or "
                    "`source scripts/_venv.sh && align_venv 'test,oracle' && align_trl_ppo_oracle`")
    for mod in ("transformers", "accelerate", "datasets"):
        pytest.importorskip(mod)
    out = tmp_path_factory.mktemp("trl024") / "ppo.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(DRIVER), str(TRL_DIR), str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"TRL 0.24 PPO run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    data = torch.load(out)
    assert data["trl_version"] == "0.24.0"
    whitens = {c["which"]: c for c in data["calls"] if c["fn"] == "masked_whiten"}
    assert sorted(whitens) == ["advantages", "rewards"]  # whiten_rewards=True, then the advantages
    means = [c for c in data["calls"] if c["fn"] == "masked_mean"]
    # TRL's order per micro-batch: vf_loss, vf_clipfrac, pg_loss, pg_clipfrac (the clip fractions are untagged).
    assert [c["which"] for c in means] == ["vf_loss", "?", "pg_loss", "?"] * (len(means) // 4) and means
    micro = [{"vf": means[i], "vf_clipfrac": means[i + 1]["out"], "pg": means[i + 2],
              "pg_clipfrac": means[i + 3]["out"]} for i in range(0, len(means), 4)]
    return {**data, "rewards_call": whitens["rewards"], "adv_call": whitens["advantages"], "micro": micro}


def test_trl_masks_one_position_past_the_response(run):
    rc = run["rewards_call"]
    lengths, resp, t = rc["sequence_lengths"], rc["postprocessed_responses"], rc["x"].shape[1]
    idx = torch.arange(t)[None, :]
    assert torch.equal(~rc["padding_mask"], idx <= lengths[:, None])
    assert torch.equal(~rc["padding_mask_p1"], idx <= lengths[:, None] + 1)
    room = lengths + 1 < t
    eos_rows = [i for i in range(len(lengths)) if room[i] and lengths[i] >= 0 and resp[i, lengths[i]] == run["eos_id"]]
    assert eos_rows and (~room).any()  # rows that stopped at an EOS with room after it, and rows cut at the window
    for i in range(len(lengths)):
        end = int(lengths[i]) + 1 if room[i] else int(lengths[i])
        rewards_before_whitening = rc["x"][i]
        # TRL's score lands at `actual_end`: one past the response (where the KL term is 0), or on the last token of
        # a row cut at the window's end
        if room[i]:
            assert rewards_before_whitening[end] == rc["scores"][i]
            assert not rewards_before_whitening[end + 1:].any()
        assert rc["values"][i, end] != 0 and not rc["values"][i, end + 1:].any()  # V of the state after the EOS kept


def test_reward_whitening_matches_trl(run):
    rc, ac = run["rewards_call"], run["adv_call"]
    assert rc["shift_mean"] is False and torch.equal(rc["mask"], ~rc["padding_mask_p1"])
    mine = whiten(rc["x"], rc["mask"], shift_mean=False)
    assert close(mine, ac["rewards"])  # TRL's rewards after masked_whiten + masked_fill(padding_mask_p1, 0)
    assert float(ac["rewards"][rc["mask"]].std()) == pytest.approx(1.0, abs=1e-3)  # it did whiten


@pytest.mark.parametrize("what", ["advantages", "returns"])
def test_gae_matches_trl_on_its_value_mask(run, what):
    ac = run["adv_call"]
    adv, ret = gae(ac["rewards"], ac["values"], ~ac["padding_mask_p1"], run["gamma"], run["lam"])
    assert (run["gamma"], run["lam"]) == (0.9, 0.8)  # neither 1: the discounting and the trace both count
    mine, theirs = (adv, ac["x"]) if what == "advantages" else (ret, ac["returns"])
    assert close(mine, theirs), float((mine - theirs).abs().max())
    assert theirs.abs().max() > 0.5


def test_advantage_whitening_matches_trl(run):
    ac = run["adv_call"]
    assert ac["shift_mean"] is True and torch.equal(ac["mask"], ~ac["padding_mask"])
    mine = whiten(ac["x"], ~ac["padding_mask"])
    final = run["micro"][0]["pg"]["advantages"]  # TRL's advantages after masked_whiten + masked_fill(padding_mask)
    assert close(mine, final), float((mine - final).abs().max())


def test_clipped_value_loss_matches_trl(run):
    fracs = []
    for mb in run["micro"]:
        vf = mb["vf"]
        v = vf["vpred"].clone().requires_grad_(True)
        loss, frac = value_loss(v, vf["mb_values"], vf["mb_return"], vf["mask"], run["cliprange_value"])
        loss.backward()
        assert abs(loss.item() - mb["pg"]["vf_loss"].item()) <= TOL
        assert abs(float(frac) - float(mb["vf_clipfrac"])) <= TOL
        assert close(v.grad, mb["pg"]["vf_grad"])
        fracs.append(float(frac))
    assert any(0 < f < 1 for f in fracs), fracs  # the clipped arm is taken on some tokens, not on all


def test_clipped_policy_loss_matches_trl(run):
    fracs = []
    for mb in run["micro"]:
        pg = mb["pg"]
        logp = pg["new_logprobs"].clone().requires_grad_(True)
        loss, frac = policy_loss(logp, pg["mb_logprobs"], pg["mb_advantage"], pg["mask"], run["cliprange"])
        loss.backward()
        assert abs(loss.item() - pg["out"].item()) <= TOL
        assert abs(float(frac) - float(mb["pg_clipfrac"])) <= TOL
        assert close(logp.grad, pg["pg_grad"])
        fracs.append(float(frac))
    assert any(0 < f < 1 for f in fracs), fracs
