"""rlft rm: the Bradley-Terry loss by hand, preference pairs, a tiny reward model that learns to rank
held-out pairs, its export, exact resume, and the command's one-line errors."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from rlft.algorithms import PREFERENCE_LOSSES, bradley_terry_loss, pairwise_accuracy
from rlft.config.rm_schema import RM_KEY_CLASSES, RMConfig
from rlft.data import DataError
from tests.support import ROOT, leaf_keys, one_error_line, run_cli

GOOD = ["good", "great", "fine", "right"]
BAD = ["bad", "poor", "wrong", "awful"]
WORDS = "apple river stone cloud table green quick music light paper seven north".split()
# Raw text (no chat template): a reply's last token is its marker, which the score head reads at once.
FAST = ["model=tiny", "model.dtype=fp32", "data.chat_template=false", "trainer.threads=1", "trainer.eval_every=0",
        "trainer.eval_at_start=false", "trainer.batch_size=8", "optim.lr=1e-2", "optim.warmup_steps=0",
        "logger.console=false"]


def write_pairs(path, n: int, seed: int = 0, **extra) -> None:
    """``n`` separable pairs: the same reply body, ending in a good word (chosen) or a bad one (rejected)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        body = " ".join(rng.choice(WORDS) for _ in range(3))
        row = {"prompt": f"Q: {' '.join(rng.choice(WORDS) for _ in range(4))}\nA:",
               "chosen": f" {body} {rng.choice(GOOD)}", "rejected": f" {body} {rng.choice(BAD)}", **extra}
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rm_compose(*overrides: str):
    from omegaconf import OmegaConf

    from rlft.config.loading import compose
    from rlft.rm.command import RM_SCHEMA

    cfg, raw, _ = compose(list(overrides), RM_SCHEMA)
    return cfg, OmegaConf.to_yaml(raw, resolve=True)


def train(run_dir, *overrides: str) -> dict:
    from rlft.rm.train import train_rm

    cfg, text = rm_compose(*overrides)
    return train_rm(cfg, run_dir, text)


def records(run_dir) -> list[dict]:
    from rlft.output.tracking import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


# ---------------------------------------------------------------------------------------
# The loss and the accuracy


def test_bradley_terry_loss_and_accuracy_against_hand_values():
    r_c, r_r = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0])
    # -log sigmoid(1) = log(1 + e^-1) = 0.3132617, -log sigmoid(0) = log 2 = 0.6931472
    assert bradley_terry_loss(r_c, r_r).item() == pytest.approx((0.3132617 + 0.6931472) / 2, abs=1e-6)
    # margins 0.5 and -1: -log sigmoid(0.5) = 0.4740770, -log sigmoid(1) = 0.3132617
    margin = torch.tensor([0.5, -1.0])
    assert bradley_terry_loss(r_c, r_r, margin).item() == pytest.approx((0.4740770 + 0.3132617) / 2, abs=1e-6)
    assert PREFERENCE_LOSSES.get("bradley_terry") is bradley_terry_loss
    # finite for a gap a naive log(sigmoid(x)) underflows on
    assert bradley_terry_loss(torch.tensor([0.0]), torch.tensor([200.0])).item() == pytest.approx(200.0)
    # a tie counts as wrong
    assert pairwise_accuracy(torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 3.0])).item() == pytest.approx(1 / 3)


def test_gradient_pushes_the_chosen_score_up():
    r_c, r_r = torch.tensor([0.3], requires_grad=True), torch.tensor([0.1], requires_grad=True)
    bradley_terry_loss(r_c, r_r).backward()
    expected = -(1 - torch.sigmoid(torch.tensor(0.2))).item()  # d/dr_c of -log sigmoid(r_c - r_r)
    assert r_c.grad.item() == pytest.approx(expected) and r_r.grad.item() == pytest.approx(-expected)


def test_every_rm_config_key_has_a_resume_class():
    from rlft.state.resume_rules import rule

    keys = leaf_keys(RMConfig)
    assert "data.chosen_field" in keys and "model.lora.r" in keys and "optim.lr" in keys
    assert not [k for k in keys if rule(k, RM_KEY_CLASSES) is None]


# ---------------------------------------------------------------------------------------
# Pairs


def test_pairs_load_messages_margins_and_drop_identical_pairs(tmp_path):
    from rlft.config.rm_schema import PairsConfig
    from rlft.rm.data import load_pairs

    rows = [{"q": [{"role": "user", "content": f"hi {i}"}], "good": [{"role": "assistant", "content": "yes"}],
             "bad": "no", "m": i} for i in range(5)]
    rows.append({"q": "same", "good": "x", "bad": "x", "m": 1})
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = PairsConfig(path=str(path), prompt_field="q", chosen_field="good", rejected_field="bad", margin_field="m",
                      num_eval=2)
    pairs = load_pairs(cfg)
    assert pairs.identical == (1, 0)
    assert len(pairs.train) == 3 and len(pairs.eval) == 2
    assert pairs.eval[-1].margin == 4.0 and pairs.train[0].chosen[0]["content"] == "yes"
    assert pairs.train[0].where == f"{path}:1"


@pytest.mark.parametrize("row, words", [
    ({"prompt": "p", "rejected": "b"}, ["p.jsonl:2", "no 'chosen' reply"]),
    ({"prompt": "p", "chosen": "", "rejected": "b"}, ["p.jsonl:2", "no 'chosen' reply"]),
    ({"prompt": "p", "chosen": "a", "rejected": 3}, ["p.jsonl:2", "'rejected' is a int"]),
])
def test_bad_pair_rows_name_the_file_and_row(tmp_path, row, words):
    from rlft.config.rm_schema import PairsConfig
    from rlft.rm.data import load_pairs

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as e:
        load_pairs(PairsConfig(path=str(path), num_eval=0))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_pairs_from_parquet_with_a_held_out_file(tmp_path):
    import datasets

    from rlft.config.rm_schema import PairsConfig
    from rlft.rm.data import load_pairs

    write_pairs(tmp_path / "a.jsonl", 6)
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "a.parquet"))
    pairs = load_pairs(PairsConfig(path=str(tmp_path / "a.parquet"), eval_path=str(tmp_path / "a.jsonl")))
    assert len(pairs.train) == 6 and len(pairs.eval) == 6 and pairs.train[0].chosen == pairs.eval[0].chosen


# ---------------------------------------------------------------------------------------
# Training, export and resume on the tiny model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny reward model trained for 8 steps on 64 pairs; 32 held-out pairs with other prompts."""
    root = tmp_path_factory.mktemp("rm")
    write_pairs(root / "train.jsonl", 64, seed=0)
    with (root / "train.jsonl").open("a") as f:  # two pairs that say nothing: dropped, counted
        f.write(json.dumps({"prompt": "Q: same\nA:", "chosen": " x", "rejected": " x"}) + "\n")
        f.write(json.dumps({"prompt": "Q: same\nA:", "chosen": " y", "rejected": " y"}) + "\n")
    write_pairs(root / "test.jsonl", 32, seed=1)
    run_dir = root / "run"
    train(run_dir, *FAST, f"data.path={root / 'train.jsonl'}", f"data.eval_path={root / 'test.jsonl'}",
          "trainer.steps=8", "trainer.eval_at_start=true")
    return root, run_dir


def test_a_tiny_reward_model_learns_to_rank_held_out_pairs(trained):
    _, run_dir = trained
    recs = records(run_dir)
    first, last = recs[0], recs[-1]
    assert first["step"] == 0 and last["step"] == 8
    assert last["eval/rm_accuracy"] >= 0.9, (first, last)
    assert last["eval/rm_loss"] < 0.5 * first["eval/rm_loss"]
    assert last["eval/rm_margin"] > first["eval/rm_margin"] + 1.0
    assert {"rm/loss", "rm/accuracy", "rm/margin", "rm/grad_norm", "rm/lr"} <= set(recs[5])
    assert (run_dir / "checkpoints" / "step_000008").is_dir() and (run_dir / "config.yaml").is_file()
    log = (run_dir / "train.log").read_text()
    assert "dropped pairs whose chosen and rejected replies are the same: 2 training, 0 held-out" in log
    assert "64 training pairs, 32 held out" in log
    assert (run_dir / "plots.png").stat().st_size > 0


def test_export_loads_with_transformers_and_scores_as_the_trained_model(trained, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlft.commands.export import export
    from rlft.rm.data import encode_pairs, load_pairs
    from rlft.rm.model import build_reward_model
    from rlft.rm.state import load_weights

    root, run_dir = trained
    cfg, _ = rm_compose(*FAST, f"data.path={root / 'test.jsonl'}", "data.num_eval=0")
    rm = build_reward_model(cfg.model, cfg.seed, torch.device("cpu"))
    load_weights(rm, run_dir / "checkpoints" / "step_000008")
    rm.model.eval()
    pairs, _ = encode_pairs(load_pairs(cfg.data).train, rm.tokenizer, cfg.data)
    seqs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    with torch.no_grad():
        expected = rm.scores(seqs)
    export(run_dir, tmp_path / "out")  # rlft export of the checkpoint, beside the run's own export
    for out in (run_dir / "reward_model", tmp_path / "out"):
        model = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
        tok = AutoTokenizer.from_pretrained(str(out))
        assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id
        batch = tok.pad({"input_ids": seqs}, return_tensors="pt")
        with torch.no_grad():
            got = model(**batch).logits[:, 0]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (got[: len(pairs)] > got[len(pairs):]).float().mean() >= 0.9


# ---------------------------------------------------------------------------------------
# Scores in fp32 under bf16 (issue 35 item 6): two replies whose scores differ by 1e-4 at 1.0, where
# bf16's step is 2^-7 = 0.0078, still order.

CLOSE = 1e-4


def head_for(hidden: torch.Tensor, targets: list[float]) -> torch.Tensor:
    """The (1, hidden) head weight in fp32 whose products with the rows of ``hidden`` are ``targets``
    (the least-norm solution, in float64)."""
    h = hidden.double()
    return (h.T @ torch.linalg.solve(h @ h.T, torch.tensor(targets, dtype=torch.float64)))[None].float()


def head_inputs(model, run) -> torch.Tensor:
    """The score head's input at the last position of each row, as ``run()`` feeds it (rows of one length)."""
    head = min(((n, m) for n, m in model.named_modules() if n.endswith("score")), key=lambda nm: len(nm[0]))[1]
    seen = []
    handle = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0][:, -1].detach().clone()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return torch.cat(seen)


@pytest.mark.parametrize("lora", [True, False])
def test_bf16_training_scores_closer_than_a_bf16_step_still_order(lora):
    """The training forward (held-out accuracy, margin and a training step's) under model.dtype=bf16: the head
    runs in fp32 on the bf16 hidden state, its weight kept in fp32."""
    from rlft.rm.data import Encoded
    from rlft.rm.model import build_reward_model
    from rlft.rm.train import evaluate, train_step

    cfg, _ = rm_compose("model=tiny", "model.dtype=bf16", f"model.lora.enabled={lora}", "data.path=p.jsonl")
    rm = build_reward_model(cfg.model, 0, torch.device("cpu"))
    chosen, rejected = [40, 41, 42, 43, 44], [40, 41, 42, 43, 45]
    rm.model.eval()
    hidden = head_inputs(rm.model, lambda: rm.scores([chosen, rejected]))
    weight = next(p for n, p in rm.trainable().items() if "score" in n)
    assert weight.dtype == torch.float32
    with torch.no_grad():
        weight.copy_(head_for(hidden, [1.0 + CLOSE, 1.0]))
        got = rm.scores([chosen, rejected])
    assert got.dtype == torch.float32
    assert abs(got[0].item() - (1.0 + CLOSE)) < 1e-5 and abs(got[1].item() - 1.0) < 1e-5, got.tolist()
    loss = PREFERENCE_LOSSES.get("bradley_terry")
    held_out = evaluate(rm, [Encoded(chosen, rejected, None)], 2, loss)
    assert held_out["eval/rm_accuracy"] == 1.0 and abs(held_out["eval/rm_margin"] - CLOSE) < 1e-5, held_out
    optimizer = torch.optim.SGD(list(rm.trainable().values()), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    step = train_step(rm, [Encoded(chosen, rejected, None)], optimizer, scheduler, 2, 1.0, loss)
    assert step["rm/accuracy"] == 1.0 and abs(step["rm/margin"] - CLOSE) < 1e-5, step
    assert weight.grad is not None and weight.grad.dtype == torch.float32


def test_exported_bf16_scores_closer_than_a_bf16_step_still_order(tmp_path):
    """Export, then reward.models scoring in bf16: the fp32 head is saved and loaded in fp32 and applied in fp32."""
    from transformers import AutoModelForSequenceClassification

    from rlft.config.schemas.reward import RewardModelConfig
    from rlft.rewards.functions import Sample
    from rlft.rewards.models import RewardModel
    from rlft.rm.data import rendering
    from rlft.rm.model import build_reward_model, save_reward_model

    cfg, _ = rm_compose("model=tiny", "model.dtype=bf16", "data.path=p.jsonl", "data.chat_template=false")
    rm = build_reward_model(cfg.model, 0, torch.device("cpu"))
    replies = [Sample("Q: apple river\nA:", " good", "", 1, False), Sample("Q: apple river\nA:", " bad", "", 1, False)]

    def scorer(out):
        return RewardModel(RewardModelConfig(path=str(out), batch_size=1), torch.device("cpu"), "bf16")

    first = scorer(save_reward_model(rm, tmp_path / "first", rendering(cfg.data, rm.tokenizer)))
    hidden = head_inputs(first.model, lambda: first.score(replies))
    weight = next(p for n, p in rm.trainable().items() if "score" in n)
    with torch.no_grad():
        weight.copy_(head_for(hidden, [1.0 + CLOSE, 1.0]))
    out = save_reward_model(rm, tmp_path / "second", rendering(cfg.data, rm.tokenizer))
    got = scorer(out).score(replies)
    assert abs(got[0] - (1.0 + CLOSE)) < 1e-5 and abs(got[1] - 1.0) < 1e-5, got
    plain = AutoModelForSequenceClassification.from_pretrained(str(out))  # still a transformers directory
    torch.testing.assert_close(plain.score.weight, weight.detach(), rtol=0, atol=0)


def test_resume_continues_exactly(tmp_path):
    from safetensors.torch import load_file

    write_pairs(tmp_path / "p.jsonl", 10)
    common = [*FAST, f"data.path={tmp_path / 'p.jsonl'}", "data.num_eval=2", "trainer.export=false",
              "trainer.batch_size=6", "trainer.micro_batch_size=4", "model.lora.dropout=0.1", "optim.lr=1e-3"]
    train(tmp_path / "a", *common, "trainer.steps=4")
    train(tmp_path / "b", *common, "trainer.steps=2")  # stopped after step 2 (its final checkpoint)
    train(tmp_path / "b", *common, "trainer.steps=4", "trainer.resume=auto")
    wa, wb = (load_file(str(tmp_path / d / "checkpoints/step_000004/trainable.safetensors")) for d in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = ({r["step"]: r["rm/loss"] for r in records(tmp_path / d) if "rm/loss" in r} for d in "ab")
    assert ra == rb and sorted(ra) == [1, 2, 3, 4]
    assert len({round(v, 6) for v in ra.values()}) == 4  # the steps trained (dropout on: the RNG state matters)


def test_batches_cover_every_pair_once_per_epoch():
    from rlft.state.job_start import batch_indices

    drawn = batch_indices(0, 10, 7, seed=3) + batch_indices(10, 4, 7, seed=3)
    assert sorted(drawn[:7]) == list(range(7)) and sorted(drawn[7:]) == list(range(7))
    assert drawn[:7] != drawn[7:]  # a new order each epoch
    assert batch_indices(5, 4, 7, seed=3) == drawn[5:9]


# ---------------------------------------------------------------------------------------
# The command


def test_cli_override_typo_names_the_key(tmp_path):
    line = one_error_line(run_cli(["rm", "model=tiny", "data.path=p.jsonl", "trainer.stepz=3"], tmp_path), 2)
    assert "trainer.stepz" in line and "steps" in line
    line = one_error_line(run_cli(["rm", "model=tiny", "algo=grpo"], tmp_path), 2)
    assert "'algo'" in line and "data" in line
    line = one_error_line(run_cli(["rm", "model=tiny"], tmp_path), 2)
    assert "needs data.path=" in line


def test_cli_bad_path_is_one_line(tmp_path):
    line = one_error_line(run_cli(["rm", "model=tiny", "data.path=missing.jsonl", "hydra.run.dir=r1"], tmp_path), 2)
    assert "missing.jsonl: no such file" in line
    assert json.loads((tmp_path / "r1" / "job.json").read_text())["exit_code"] == 2


def test_cli_missing_column_is_one_line(tmp_path):
    (tmp_path / "nochosen.jsonl").write_text(json.dumps({"prompt": "p", "answer": "a", "rejected": "b"}) + "\n")
    line = one_error_line(run_cli(["rm", "model=tiny", "data.path=nochosen.jsonl", "hydra.run.dir=r2"], tmp_path), 2)
    assert "nochosen.jsonl" in line and "no column 'chosen'" in line and "answer" in line


def test_cli_cfg_job_prints_the_rm_config(tmp_path):
    proc = run_cli(["rm", "model=tiny", "data.path=p.jsonl", "data.chosen_field=better", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "chosen_field: better" in proc.stdout and "loss: bradley_terry" in proc.stdout
    assert "algo" not in proc.stdout and math.isfinite(len(proc.stdout))
    assert (ROOT / "conf" / "rm.yaml").is_file()


def test_conversation_ids_extend_the_prompt_with_the_reply():
    from rlft.data.chat import prompt_ids
    from rlft.data.conversation import conversation_ids
    from rlft.models.loading import load_tokenizer

    cfg, _ = rm_compose("model=tiny", "data.path=p.jsonl")
    tok = load_tokenizer(cfg.model)
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    full = conversation_ids(tok, prompt, "5")
    messages = [*prompt, {"role": "assistant", "content": "5"}]
    assert full == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert full[: len(prompt_ids(tok, prompt))] == prompt_ids(tok, prompt)  # the reply follows the prompt
    assert conversation_ids(tok, "Q: 2+3\nA:", " 5", chat_template=False) == tok("Q: 2+3\nA: 5")["input_ids"]
    with pytest.raises(DataError, match="chat messages"):
        conversation_ids(tok, "Q", [{"role": "assistant", "content": "5"}], chat_template=False)


@pytest.mark.parametrize("chat", [False, True])
def test_the_export_records_its_rendering_and_reward_models_score_by_it(tmp_path, chat):
    """Issue 34, items 6-7: the export says how pairs were rendered (chat template, system prompt, max_length);
    reward.models reads every pair as training did, cut the same way (the whole prompt, the reply's end), and
    a pair whose prompt leaves no room is dropped in training and unscored in scoring; config fields win."""
    from rlft.config.schemas.reward import RewardModelConfig
    from rlft.data.conversation import RECORD, Rendering, conversation_ids, read_rendering
    from rlft.rewards.functions import Sample
    from rlft.rewards.models import RewardModel
    from rlft.rm.data import Pair, encode_pairs, rendering
    from rlft.rm.model import build_reward_model, save_reward_model

    system = ["data.system_prompt=Grade kindly."] if chat else []
    cfg, _ = rm_compose("model=tiny", "model.dtype=fp32", "data.path=p.jsonl", f"data.chat_template={chat}",
                        "data.max_length=40", *system)
    rm = build_reward_model(cfg.model, 0, torch.device("cpu"))
    out = save_reward_model(rm, tmp_path / "out", rendering(cfg.data, rm.tokenizer))
    record = Rendering(chat, "Grade kindly." if chat else None, 40)
    assert read_rendering(out) == record and json.loads((out / RECORD).read_text())["chat_template"] is chat
    pairs = [Pair("a", "Q: 2+3\nA:", " 5", " 6"),
             Pair("b", "Q: 2+3\nA:", " first" * 60 + " so 5", " 6"),  # the chosen reply is cut
             Pair("c", "Q: " + " +".join(map(str, range(40))) + "\nA:", " 5", " 6")]  # no room: dropped
    encoded, dropped = encode_pairs(pairs, rm.tokenizer, cfg.data)
    assert dropped == 1 and [e.cut for e in encoded] == [False, True] and len(encoded[1].chosen) == 40
    scorer = RewardModel(RewardModelConfig(path=str(out)), torch.device("cpu"), "fp32")
    assert scorer.rendering == record
    for p, e in zip(pairs, encoded):
        assert scorer.fit(Sample(p.prompt, p.chosen, "", 1, False)).ids == e.chosen
        assert scorer.fit(Sample(p.prompt, p.rejected, "", 1, False)).ids == e.rejected
    assert math.isnan(scorer.score([Sample(pairs[2].prompt, " 5", "", 1, False)])[0])
    assert scorer.take_counts() == {"truncated": 0, "too_long": 1}
    told = RewardModel(RewardModelConfig(path=str(out), chat_template=not chat, system_prompt="", max_length=4096),
                       torch.device("cpu"), "fp32")
    assert told.rendering == Rendering(not chat, None, 4096)
    assert told.render(Sample(pairs[1].prompt, pairs[1].chosen, "", 1, False)) == conversation_ids(
        rm.tokenizer, pairs[1].prompt, pairs[1].chosen, chat_template=not chat)


def test_a_record_that_cannot_be_read_is_one_line(tmp_path):
    from rlft.data.conversation import RECORD, read_rendering
    from rlft.errors import ModelError

    assert read_rendering(tmp_path) is None  # no record: a model from TRL, scored with the defaults
    (tmp_path / RECORD).write_text('{"chat_template": true}')
    with pytest.raises(ModelError, match=f"{RECORD}: not a readable rendering record .*KeyError"):
        read_rendering(tmp_path)


def test_full_finetuning_of_a_local_causal_lm_without_pad_token(tmp_path):
    """model=local: a causal LM directory gets a new score head; its tokenizer's missing pad token is
    set to EOS and said; full fine-tuning trains every weight and exports scores equal to the model's."""
    from transformers import AutoModelForSequenceClassification

    from rlft.models.loading import load_base
    from rlft.rm.model import build_reward_model, save_reward_model
    from rlft.rm.train import train_step

    cfg, _ = rm_compose("model=tiny", "model.dtype=fp32", "data.path=p.jsonl")
    base, tok = load_base(cfg.model, torch.float32, 0)
    tok.pad_token = None
    base.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    cfg, _ = rm_compose("model=local", f"model.path={tmp_path / 'lm'}", "model.dtype=fp32", "model.lora.enabled=false",
                        "data.path=p.jsonl")
    notes: list[str] = []
    rm = build_reward_model(cfg.model, 0, torch.device("cpu"), notes)
    assert len(notes) == 1 and "no pad token" in notes[0] and rm.tokenizer.pad_token_id == tok.eos_token_id
    assert not rm.lora and len(rm.trainable()) == len(list(rm.model.parameters()))
    from rlft.algorithms import bradley_terry_loss
    from rlft.rm.data import Encoded
    from rlft.training.optimizer import adamw

    opt, sched = adamw([{"params": list(rm.trainable().values()), "lr": 1e-3}], cfg.optim, 1)
    before = rm.model.model.embed_tokens.weight.detach().clone()
    batch = [Encoded([5, 6, 7], [5, 6, 8], None), Encoded([9, 10], [9, 11, 12], None)]
    metrics = train_step(rm, batch, opt, sched, 1, 1.0, bradley_terry_loss)
    assert metrics["rm/loss"] > 0 and not torch.equal(before, rm.model.model.embed_tokens.weight)
    save_reward_model(rm, tmp_path / "out")
    rm.model.eval()
    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "out")).eval()
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, rm.tokenizer.pad_token_id], [9, 11, 12, 13]])
        got = loaded(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])).logits[:, 0]
        torch.testing.assert_close(got, rm.scores([[5, 6, 7], [9, 11, 12, 13]]), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_cli_resume_after_kill_is_exact(tmp_path):
    """kill -9 between checkpoints, resume: the same weights and losses as an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    from rlft.state import checkpoint as ckpt

    write_pairs(tmp_path / "p.jsonl", 16)
    args = ["rm", *FAST, "data.path=p.jsonl", "data.num_eval=4", "trainer.export=false", "trainer.save_every=2"]
    ref = run_cli([*args, "trainer.steps=10", "hydra.run.dir=ref"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    proc = subprocess.Popen([sys.executable, "-m", "rlft.cli", *args, "trainer.steps=1000", "hydra.run.dir=b"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while ckpt.latest_checkpoint(tmp_path / "b") is None and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = ckpt.checkpoint_step(ckpt.latest_checkpoint(tmp_path / "b"))
    assert killed_at is not None and killed_at < 10
    resumed = run_cli([*args, "trainer.steps=10", "trainer.resume=auto", "hydra.run.dir=b"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    wa, wb = (load_file(str(tmp_path / d / "checkpoints/step_000010/trainable.safetensors")) for d in ("ref", "b"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = ({r["step"]: r["rm/loss"] for r in records(tmp_path / d) if "rm/loss" in r} for d in ("ref", "b"))
    assert ra == rb and len(ra) == 10


def test_batch_size_must_split_evenly_over_the_ranks():
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.batch_size=8 must be a multiple of trainer.nproc=3"):
        rm_compose(*FAST, "data.path=p.jsonl", "trainer.nproc=3", "trainer.batch_size=8")


def test_each_rank_scores_an_equal_contiguous_share():
    from rlft.parallel.distributed import DataParallel

    items = list(range(8))
    shares = [DataParallel(r, 2).share(items) for r in range(2)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sum((DataParallel(r, 2).share(list(range(5))) for r in range(2)), []) == list(range(5))


@pytest.mark.slow
def test_two_ranks_train_the_reward_model_one_process_trains(tmp_path):
    """trainer.nproc=2 (torch's launcher, gloo): each rank scores half of each batch and the gradients are
    summed, so the weights, losses and held-out accuracy are one process's (to float summation order);
    a 2-rank run stopped at step 2 and resumed on 2 ranks ends at the same place."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from rlft.state import checkpoint as ckpt
    from tests.support import dist_env

    write_pairs(tmp_path / "p.jsonl", 20)
    fast = [a for a in FAST if not a.startswith("trainer.eval_every")]
    args = ["rm", *fast, "data.path=p.jsonl", "data.num_eval=5", "trainer.micro_batch_size=4", "model.lora.dropout=0",
            "trainer.eval_every=2"]

    def rlft(*extra: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "rlft", *args, *extra], cwd=tmp_path, env=dist_env(),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]

    rlft("trainer.steps=4", "hydra.run.dir=one")
    rlft("trainer.steps=2", "trainer.nproc=2", "hydra.run.dir=two")
    rlft("trainer.steps=4", "trainer.nproc=2", "trainer.resume=auto", "hydra.run.dir=two")
    final = {d: load_file(str(tmp_path / d / "checkpoints/step_000004/trainable.safetensors")) for d in ("one", "two")}
    assert final["one"].keys() == final["two"].keys()
    for k, a in final["one"].items():
        assert float((a - final["two"][k]).norm() / a.norm().clamp(min=1e-12)) < 1e-5, k
    steps = {d: {r["step"]: r for r in records(tmp_path / d)} for d in ("one", "two")}
    assert sorted(steps["one"]) == sorted(steps["two"]) == [1, 2, 3, 4]
    for step, r in steps["one"].items():
        for key in ("rm/loss", "eval/rm_accuracy", "eval/rm_loss"):
            if key in r:
                assert steps["two"][step][key] == pytest.approx(r[key], rel=1e-5, abs=1e-6), (step, key)
    assert steps["one"][4]["rm/loss"] < steps["one"][1]["rm/loss"]  # it trained
    state = ckpt.read_json(tmp_path / "two/checkpoints/step_000004", ckpt.STATE)
    assert state["world_size"] == 2 and json.loads((tmp_path / "two/job.json").read_text())["status"] == "ok"
    assert (tmp_path / "two/reward_model/config.json").is_file()


@pytest.mark.slow
def test_cli_sweep_summarises_the_reward_models(tmp_path):
    import csv

    write_pairs(tmp_path / "p.jsonl", 12)
    proc = run_cli(["rm", "-m", *FAST, "data.path=p.jsonl", "data.num_eval=4", "trainer.steps=2", "trainer.export=false",
                    "optim.lr=1e-3,1e-2", "hydra.sweep.dir=sweep"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert [r["job"] for r in rows] == ["optim.lr=0.001", "optim.lr=0.01"]
    assert all(r["status"] == "ok" and r["steps"] == "2" and float(r["eval/rm_accuracy"]) >= 0 for r in rows)
    assert "eval/rm_accuracy" in proc.stdout and (tmp_path / "sweep" / "summary.png").is_file()


def test_rm_help_lists_the_groups(capsys):
    from rlft.cli import main

    assert main(["rm", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: rlft rm" in out and "tiny" in out and "smollm2_135m" in out
