"""data.pack: varlen in the trainer: the micro-batch becomes one row of documents with cu_seqlens."""

from __future__ import annotations

import torch
from training_helpers import tiny_config

from hybrid_attention.data.tokenizer import separator_id
from hybrid_attention.training.distributed import init_distributed
from hybrid_attention.training.trainer import Trainer


def test_trainer_varlen_step(tmp_path) -> None:
    """A varlen training step runs; its inputs carry cu_seqlens and its loss equals the loss of each document alone."""
    trainer = Trainer(tiny_config(tmp_path, "train.device=cpu", "train.save_final=false", "data.pack=varlen"),
                      init_distributed("cpu"), quiet=True)
    sep = separator_id(trainer.data.tokenizer)
    x = trainer.data.train.next_batch()
    for _ in range(500):  # a batch with a document boundary inside a row (stdlib files are long)
        if (x[:, :-1] == sep).any():
            break
        x = trainer.data.train.next_batch()
    inputs = trainer._lm_inputs(x)
    assert inputs["input_ids"].shape == (1, x.numel())
    model = trainer.user_model.double().eval()
    with torch.no_grad():
        packed = model(**inputs).logits
        cu = inputs["cu_seqlens"].tolist()
        ids = inputs["input_ids"]
        alone = torch.cat([model(ids[:, cu[i]:cu[i + 1]]).logits for i in range(len(cu) - 1)], 1)
    assert len(cu) > x.shape[0] + 1 and (packed - alone).abs().max().item() < 1e-10
    model.float().train()
    assert torch.isfinite(torch.tensor(trainer.train_step()))
