"""Hugging Face models called the way their examples call them, `model(input_ids=..., attention_mask=...,
labels=...)` returning a `ModelOutput`, measured by `attach` with no change to the loop: tokens per
sample from `input_ids`, the real tokens an `attention_mask` leaves, tokens/s, the precision under
bf16 autocast, and the training FLOPs against PaLM's and torchtitan's 6N + 12·L·H·Q·T. A model
whose inputs cannot be told apart gets its reason in `not_measured`, never a made-up figure.

Real `transformers` (the `hf` extra), tiny configurations built here, nothing downloaded
(HF_HUB_OFFLINE). Each job runs at world size 1 on the plain module: no process group.

The FLOPs checks (definitions: scaling/instrument/flops.py, tests/test_transformer.py): N is the
parameters that multiply, all but the tables only looked up (GPT-2's position embedding; Llama's
untied token embedding; GPT-2's token embedding is its tied output layer and counts). The counter
counts matmuls and attention; the formula also gives 6 FLOPs per parameter to the norms' gains and
the biases, which are elementwise. So the count equals 6·(N - norm and bias parameters) + 12·L·H·Q·T
exactly, and sits under the formula by those parameters' share: 0.26% for the tiny Llama (no
biases), 0.1% for GPT-2 small's configuration, but 1.5% for the tiny GPT-2 (at width 64 its biases
and norms are 1.7% of N), whose PaLM check is therefore made at GPT-2 small's configuration
(counted on the meta device: no weights).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from scaling import instrument  # noqa: E402
from scaling.instrument.flops import training_flops_per_sample  # noqa: E402
from scaling.instrument.inputs import model_input  # noqa: E402

VOCAB, SEQ, BATCH = 128, 32, 4
PADDED_FROM = 24  # the mask leaves tokens [0, 24) of every other sample, all 32 of the rest


def gpt2_tiny():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64)
    )


def llama_tiny():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
    )


def _batches(mask: bool):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3 * BATCH, SEQ))
    attention = torch.ones_like(ids)
    attention[::2, PADDED_FROM:] = 0
    return [
        {"input_ids": ids[i : i + BATCH], **({"attention_mask": attention[i : i + BATCH]} if mask else {})}
        for i in range(0, len(ids), BATCH)
    ]


def _train(run_dir, model, batches, autocast: bool = False, call=None, **settings) -> tuple[dict, dict]:
    """The job as a Hugging Face example writes it, plus attach's lines; (compute profile, summary)."""
    call = call or (lambda batch: model(**batch, labels=batch["input_ids"]).loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with instrument.attach(model, optimizer, run_dir=str(run_dir), warmup_steps=0, **settings) as meter:
        for _ in range(2):
            for batch in meter.batches(batches):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = call(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            meter.end_epoch()
    return (
        json.loads((run_dir / "compute_profile.json").read_text()),
        json.loads((run_dir / "summary.json").read_text()),
    )


@pytest.fixture(scope="module")
def gpt2_job(tmp_path_factory):
    """GPT-2 (tiny) with a padding attention_mask, in fp32."""
    torch.manual_seed(0)
    model = gpt2_tiny()
    return model, *_train(tmp_path_factory.mktemp("gpt2"), model, _batches(mask=True))


@pytest.fixture(scope="module")
def llama_job(tmp_path_factory):
    """Llama (tiny) under bf16 autocast, input_ids only."""
    torch.manual_seed(0)
    model = llama_tiny()
    return model, *_train(tmp_path_factory.mktemp("llama"), model, _batches(mask=False), autocast=True)


def _check_mfu(summary):
    """MFU is there, or absent for its one CPU reason (the achieved rate above the measured roof)."""
    assert summary["achieved_flops_per_s"] > 0 and summary["peak_flops_per_s"] > 0
    if summary["mfu"] is None:
        assert "exceeds the peak" in summary["mfu_note"], summary["mfu_note"]
    else:
        assert summary["mfu"] == pytest.approx(summary["achieved_flops_per_s"] / summary["peak_flops_per_s"])


@pytest.mark.parametrize("job", ["gpt2_job", "llama_job"])
def test_keyword_inputs_give_tokens_per_sample_tokens_per_s_flops_and_mfu(job, request):
    _, profile, summary = request.getfixturevalue(job)
    assert profile["input_keyword"] == "input_ids" and profile["input_shape"] == [SEQ] and "error" not in profile
    assert summary["tokens_per_sample"] == SEQ
    assert summary["throughput_tokens_per_s"] == pytest.approx(SEQ * summary["throughput_samples_per_s"])
    assert summary["train_flops_per_sample"] == pytest.approx(profile["train_flops"]) and profile["train_flops"] > 0
    _check_mfu(summary)
    assert summary["not_measured"] == {}


def test_attention_mask_gives_the_real_tokens_beside_the_positions(gpt2_job, llama_job):
    _, profile, summary = gpt2_job
    real = (SEQ + PADDED_FROM) / 2  # the first batch: two samples of 32 tokens, two of 24
    assert profile["real_tokens_per_sample"] == real and summary["real_tokens_per_sample"] == real
    assert summary["throughput_real_tokens_per_s"] == pytest.approx(real * summary["throughput_samples_per_s"])
    assert summary["tokens_per_sample"] == SEQ  # the positions the model computed, which FLOPs count
    # no mask: one figure, not two
    assert llama_job[2]["real_tokens_per_sample"] is None and llama_job[2]["throughput_real_tokens_per_s"] is None


def test_precision_is_bf16_under_autocast_and_fp32_without(gpt2_job, llama_job):
    assert llama_job[1]["precision"] == llama_job[2]["precision"] == "bf16"
    assert llama_job[1]["peak_precision"] == "bf16"
    assert gpt2_job[1]["precision"] == gpt2_job[2]["precision"] == "fp32"


def test_precision_of_a_model_whose_weights_are_bf16(tmp_path):
    torch.manual_seed(0)
    model = gpt2_tiny().to(torch.bfloat16)
    profile, summary = _train(tmp_path, model, _batches(mask=False)[:1])
    assert profile["precision"] == summary["precision"] == "bf16"


def test_keyword_inputs_are_seen_with_step_timing_off(tmp_path):
    """Epoch timing only: the first training forward is still looked at, once, keywords included."""
    torch.manual_seed(0)
    profile, summary = _train(tmp_path, gpt2_tiny(), _batches(mask=True)[:2], autocast=True, step_timing=False)
    assert profile["input_keyword"] == "input_ids" and profile["precision"] == "bf16"
    assert summary["tokens_per_sample"] == SEQ and summary["throughput_tokens_per_s"] > 0
    assert summary["real_tokens_per_sample"] == (SEQ + PADDED_FROM) / 2 and summary["train_flops_per_sample"] > 0


def _palm(model, config, seq: int) -> tuple[float, float]:
    """(6N + 12·L·H·Q·T, the same with the norms' and biases' parameters left out of N) per token."""
    embedding = model.get_input_embeddings().weight
    looked_up = 0 if model.get_output_embeddings().weight is embedding else embedding.numel()
    looked_up += sum(m.weight.numel() for name, m in model.named_modules() if name.endswith("wpe"))
    multiplying = sum(p.numel() for p in model.parameters()) - looked_up
    elementwise = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 1)  # norms' gains, biases
    heads = config.num_attention_heads
    attention = 12 * config.num_hidden_layers * heads * (config.hidden_size // heads) * seq
    return 6 * multiplying + attention, 6 * (multiplying - elementwise) + attention


@pytest.mark.parametrize("job", ["gpt2_job", "llama_job"])
def test_training_flops_per_token_are_palms_6n_plus_12lhqt(job, request):
    model, profile, _ = request.getfixturevalue(job)
    formula, matmuls_only = _palm(model, model.config, SEQ)
    assert profile["counted_on"] == "meta" and profile["tokens_per_sample"] == SEQ
    # every matmul and the whole T x T attention counted, nothing else: exact
    assert profile["train_flops_per_token"] == pytest.approx(matmuls_only, rel=1e-9)
    if job == "llama_job":
        assert profile["train_flops_per_token"] == pytest.approx(formula, rel=0.01)  # measured: 0.99744 of it


def test_gpt2_small_configuration_flops_per_token_within_one_percent_of_palm():
    with torch.device("meta"):  # shapes only: no weights
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    seq = 256
    counts = training_flops_per_sample(
        model, (seq,), model.config.vocab_size, input_dtype=torch.int64, input_keyword="input_ids"
    )
    formula, matmuls_only = _palm(model, model.config, seq)
    assert counts["train_flops_per_token"] == pytest.approx(formula, rel=0.01)  # measured: 0.99905 of it
    assert counts["train_flops_per_token"] == pytest.approx(matmuls_only, rel=1e-9)


class KeywordOnly(nn.Module):
    """A language model whose forward takes its token ids by keyword only: counted as it is called."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)

    def forward(self, *, input_ids, labels=None):
        return {"logits": self.out(self.embed(input_ids))}


def test_a_model_taking_input_ids_by_keyword_only_is_counted(tmp_path):
    torch.manual_seed(0)
    model = KeywordOnly()
    profile, summary = _train(
        tmp_path,
        model,
        _batches(mask=False)[:2],
        call=lambda batch: model(input_ids=batch["input_ids"])["logits"].float().mean(),
    )
    assert "error" not in profile, profile.get("error")
    assert summary["train_flops_per_sample"] == pytest.approx(SEQ * 6 * 16 * VOCAB)  # the output layer's matmul
    assert summary["tokens_per_sample"] == SEQ


class TwoInputs(nn.Module):
    """A model called with two keyword tensors, neither `input_ids`: which is the input is not known."""

    def __init__(self):
        super().__init__()
        self.left, self.right = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, left, right):
        return self.left(left) + self.right(right)


def test_inputs_not_understood_give_a_reason_and_the_true_precision(tmp_path):
    torch.manual_seed(0)
    model = TwoInputs()
    batches = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(3)]
    profile, summary = _train(
        tmp_path,
        model,
        batches,
        autocast=True,
        call=lambda batch: model(left=batch[0], right=batch[1]).float().pow(2).mean(),
    )
    reason = (
        "input not understood: the model's first training forward got no positional tensor and no input_ids, "
        "only left=, right="
    )
    assert profile["error"].startswith(reason) and profile["precision"] == "bf16"
    assert summary["precision"] == "bf16"  # autocast's, though the input is not known
    for figure in ("train_flops_per_sample", "achieved_flops_per_s", "mfu"):
        assert summary[figure] is None and summary["not_measured"][figure].startswith(reason), figure
    assert summary["mfu_note"].startswith(reason)


def test_which_argument_is_the_input():
    ids, mask, pixels = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), torch.randn(2, 3)
    assert model_input((ids,), {"attention_mask": mask})[:2] == (ids, None)  # positional first, as before
    assert model_input((), {"attention_mask": mask, "input_ids": ids, "labels": ids})[:2] == (ids, "input_ids")
    assert model_input((), {"pixel_values": pixels, "labels": ids})[:2] == (pixels, "pixel_values")
    assert model_input((), {"a": pixels, "b": pixels})[0] is None
    assert "no tensor" in model_input((), {"n": 3})[2]
