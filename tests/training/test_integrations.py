"""Where users train: a plain loop, transformers.Trainer, LoRA adapters through peft."""

from __future__ import annotations

import pytest
import torch

from helpers.families import build_tiny_hf_model
from helpers.training import TEXTS
from identifiable.errors import IdentifiableError
from identifiable.training import NullAttentionTrainer, NullFractionCallback, null_attention_penalty


def _batch(tok, texts=TEXTS):
    enc = tok(list(texts), padding=True, return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def test_a_plain_loop_lowers_the_penalty(bert_tokenizer) -> None:
    hf = build_tiny_hf_model("bert")
    batch = _batch(bert_tokenizer)
    opt = torch.optim.Adam(hf.parameters(), lr=3e-3)
    values = []
    for _ in range(8):
        p = null_attention_penalty(hf, batch)
        opt.zero_grad()
        p.backward()
        opt.step()
        values.append(float(p))
    assert values[-1] < 0.7 * values[0], values  # convergence record: it falls


class _Texts(torch.utils.data.Dataset):
    def __init__(self, tok) -> None:
        enc = tok(TEXTS * 4, padding="max_length", max_length=40, truncation=True)
        self.rows = [{k: enc[k][i] for k in enc} | {"labels": i % 2} for i in range(len(TEXTS) * 4)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return {k: torch.tensor(v) for k, v in self.rows[i].items()}


def _classifier():
    from transformers import AutoModelForSequenceClassification

    from helpers.families import tiny_config

    torch.manual_seed(0)
    cfg = tiny_config("bert")
    cfg.num_labels = 2
    return AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")


def _args(tmp_path, steps=6):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )


def test_trainer_adds_the_penalty_and_logs_the_null_fraction(tmp_path, bert_tokenizer) -> None:
    model = _classifier()
    probe = _batch(bert_tokenizer)
    callback = NullFractionCallback(probe)
    before = callback.measure(model)["null_fraction"]
    trainer = NullAttentionTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=_Texts(bert_tokenizer),
        penalty_weight=1.0,
        callbacks=[callback],
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "null_fraction" in h]
    assert len(logged) == 3
    assert all({"task_loss", "penalty_weight", "null_fraction_probe"} <= set(h) for h in logged)
    # the logged loss is the task loss plus w · the penalty
    assert logged[0]["loss"] == pytest.approx(
        logged[0]["task_loss"] + logged[0]["null_fraction"], rel=0.05
    )
    assert [h["step"] for h in callback.history] == [2, 4, 6]
    assert callback.history[-1]["null_fraction"] < before


def test_trainer_refuses_a_bad_weight(tmp_path, bert_tokenizer) -> None:
    for bad in (-0.1, float("nan")):
        with pytest.raises(IdentifiableError, match="penalty_weight"):
            NullAttentionTrainer(
                model=_classifier(),
                args=_args(tmp_path),
                train_dataset=_Texts(bert_tokenizer),
                penalty_weight=bad,
            )


def test_lora_adapters_are_the_only_weights_that_move(bert_tokenizer) -> None:
    from peft import LoraConfig, get_peft_model

    hf = build_tiny_hf_model("bert")
    model = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    batch = _batch(bert_tokenizer)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    values = []
    for _ in range(6):
        p = null_attention_penalty(model, batch)
        opt.zero_grad()
        p.backward()
        opt.step()
        values.append(float(p))
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())
    assert any(not torch.equal(after[n], v) for n, v in lora.items())
    assert values[-1] < values[0]
    # the penalty sees the adapted value projection: merging the adapters gives the same value
    merged = model.merge_and_unload()
    assert float(null_attention_penalty(merged, batch)) == pytest.approx(
        float(null_attention_penalty(model, batch)), rel=1e-5
    )
