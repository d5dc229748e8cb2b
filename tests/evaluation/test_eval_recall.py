"""MQAR / synthetic passkey train-and-evaluate: one tiny sweep end to end."""

import json

import pytest

from hybrid_attention.evaluation.recall import recall_table
from hybrid_attention.training.recall import RecallConfig, recall_sweep


def test_mqar_sweep_runs_and_reports(tmp_path):
    cfg = RecallConfig(mixers=["softmax", "s4d"], d_models=[32], lrs=[3e-3], vocab_size=64, seq_len=32,
                       num_kv_pairs=2, train_examples=64, test_examples=32, batch_size=16, epochs=1,
                       device="cpu", out_dir=str(tmp_path), model_options={"state_size": 8, "chunk_size": 8})
    rows = recall_sweep(cfg, log=lambda s: None)
    assert [r["mixer"] for r in rows] == ["softmax", "s4d"]
    assert all(0 <= r["accuracy"] <= 1 and r["state_size"] > 0 for r in rows)
    assert rows[0]["state_size"] > rows[1]["state_size"]  # KV cache vs a fixed SSM state at T=32
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "config.json").read_text())["task"] == "mqar"
    assert (tmp_path / "accuracy_vs_state.png").exists()
    assert "accuracy" in recall_table(rows)


def test_synthetic_passkey_task(tmp_path):
    cfg = RecallConfig(task="passkey", mixers=["softmax"], d_models=[32], vocab_size=32, seq_len=32,
                       train_examples=32, test_examples=16, batch_size=16, epochs=1, device="cpu",
                       out_dir=str(tmp_path))
    (row,) = recall_sweep(cfg, log=lambda s: None)
    assert row["task"] == "passkey" and 0 <= row["accuracy"] <= 1


def test_query_logits_give_the_full_forward_loss_and_accuracy():
    # the trainer reads logits at the labelled positions only: same loss and same per-example accuracy as the full
    # [B, T, vocab] forward (a random untrained model, so the argmax differs between positions)
    import torch
    import torch.nn.functional as F

    from hybrid_attention.data.mqar import recall_accuracy
    from hybrid_attention.evaluation.recall import _accuracy, query_logits
    from hybrid_attention.training.recall import build_recall_model, make_examples

    cfg = RecallConfig(vocab_size=64, seq_len=32, num_kv_pairs=3, model_options={"state_size": 8, "chunk_size": 8})
    for mixer in ("softmax", "gdn"):
        torch.manual_seed(0)
        model = build_recall_model(cfg, mixer, 32).eval()
        x, y = make_examples(cfg, 6, seed=1)
        with torch.no_grad():
            full = model(input_ids=x, use_cache=False).logits
            q = query_logits(model, x, y)
        mask = y != -100
        assert q.shape == (int(mask.sum()), 64)
        torch.testing.assert_close(q, full[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(F.cross_entropy(q, y[mask]),
                                   F.cross_entropy(full.flatten(0, 1), y.flatten(), ignore_index=-100))
        # labels made right at every other labelled position (and at all of example 0's): a non-trivial accuracy
        # that differs between examples
        y2 = y.clone()
        pos = mask.nonzero()
        hit = pos[(torch.arange(len(pos)) % 2 == 0) | (pos[:, 0] == 0)]
        y2[hit[:, 0], hit[:, 1]] = full.argmax(-1)[hit[:, 0], hit[:, 1]]
        per_example = recall_accuracy(full, y2)
        assert per_example[0] == 1 and 0.3 < per_example.mean() < 0.9
        assert abs(_accuracy(model, x, y2, batch=4, device=torch.device("cpu")) - per_example.mean().item()) < 1e-6


def test_compiled_training_step_matches_eager(monkeypatch):
    # RecallConfig.compile: the training step runs the backbone through torch.compile (static shapes; a partial last
    # batch is a second graph), the logits gather and the evaluation stay eager. Here the compiler is aot_eager (the
    # CPU CI has no time for inductor): same losses and accuracy as the eager run, and the compiled backbone ran
    # every training step (8 full batches and 1 partial per epoch, 2 epochs)
    import torch

    from hybrid_attention.training import recall

    calls, modes, real_compile = [], [], torch.compile

    def fake_compile(module, dynamic=None, mode=None):
        assert dynamic is False
        modes.append(mode)  # compile_mode reaches torch.compile (aot_eager here has no CUDA graphs to make)
        compiled = real_compile(module, backend="aot_eager", dynamic=False)
        # the real compiled module, not a wrapper (a plain function hid a bool() of it that raised on the GPU)
        compiled.register_forward_pre_hook(lambda mod, args: calls.append(args[0].shape[0]))
        return compiled

    monkeypatch.setattr(recall.torch, "compile", fake_compile)
    cfg = RecallConfig(vocab_size=64, seq_len=32, num_kv_pairs=3, train_examples=136, test_examples=32, batch_size=16,
                       epochs=2, device="cpu", model_options={"state_size": 8, "chunk_size": 8},
                       compile_mode="reduce-overhead")
    rows = {}
    for compile_ in (False, True):
        cfg.compile = compile_
        rows[compile_] = recall.train_and_eval(cfg, "softmax", 32, 3e-3, torch.device("cpu"))
    assert calls == ([16] * 8 + [8]) * 2
    assert modes == ["reduce-overhead"]
    assert (rows[False]["compile_mode"], rows[True]["compile_mode"]) == (None, "reduce-overhead")
    assert abs(rows[True]["loss"] - rows[False]["loss"]) < 1e-4 * abs(rows[False]["loss"])
    assert rows[True]["accuracy"] == rows[False]["accuracy"]


def test_sync_free_query_gather_equals_the_mask():
    # query_positions + gather (no host sync) give the masked form's logits and targets in the same order, and a
    # training step on either gives the same loss; labels_per_row finds each task's fixed count and None for ragged rows
    import torch

    from hybrid_attention.training import recall

    for task, kw in (("mqar", dict(vocab_size=64, seq_len=32, num_kv_pairs=3)), ("passkey", dict(vocab_size=40,
                                                                                                  seq_len=32))):
        cfg = RecallConfig(task=task, **kw)
        x, y = recall.make_examples(cfg, 6, seed=3)
        n = recall.labels_per_row(y)
        assert n == (3 if task == "mqar" else 4)
        pos = recall.query_positions(y, n)
        assert torch.equal(y.gather(1, pos).flatten(), y[y != -100])
        torch.manual_seed(0)
        model = recall.build_recall_model(cfg, "softmax", 16)
        torch.testing.assert_close(recall.query_logits(model, x, y, pos=pos), recall.query_logits(model, x, y),
                                   rtol=0, atol=0)
        losses = []
        for n_ in (n, None):
            torch.manual_seed(0)
            m = recall.build_recall_model(cfg, "softmax", 16)
            opt, sched = recall.recall_optimizer(cfg, m, 1e-3)
            losses.append(recall.train_step(m, m.model, opt, sched, x, y, n_).item())
        assert losses[0] == losses[1]
    y2 = y.clone()
    y2[0, 0] = 5  # one more label in row 0
    assert recall.labels_per_row(y2) is None


def test_prefetched_fresh_epochs_are_the_same_examples(monkeypatch):
    # with fresh_data, epoch e's examples are generated ahead in a thread: the same seeds as in line (seed + 7919 e),
    # one call per epoch after the first, none beyond the last epoch, and the same trained result as generating in line
    import torch

    from hybrid_attention.training import recall

    seeds, real = [], recall.make_examples

    def counting(cfg, n, seed, seq_len=None, num_kv_pairs=None):
        seeds.append(seed)
        return real(cfg, n, seed, seq_len, num_kv_pairs)

    monkeypatch.setattr(recall, "make_examples", counting)
    cfg = RecallConfig(vocab_size=64, seq_len=32, num_kv_pairs=3, train_examples=32, test_examples=16, batch_size=16,
                       epochs=3, fresh_data=True, early_stop=2.0, device="cpu")
    row = recall.train_and_eval(cfg, "softmax", 16, 3e-3, torch.device("cpu"))
    assert sorted(seeds) == sorted([0, 10_000, 7919 * 2, 7919 * 3]) and row["epochs"] == 3

    from concurrent.futures import Future

    class InLine:  # generates at submit, in the training thread
        def __init__(self, max_workers):
            pass

        def submit(self, fn, *args):
            f = Future()
            f.set_result(fn(*args))
            return f

        def shutdown(self, wait=True, cancel_futures=False):
            pass

    monkeypatch.setattr(recall, "ThreadPoolExecutor", InLine)
    in_line = recall.train_and_eval(cfg, "softmax", 16, 3e-3, torch.device("cpu"))
    assert (in_line["loss"], in_line["accuracy"]) == (row["loss"], row["accuracy"])


def test_query_gather_reads_nothing_on_the_host():
    # on the meta device any host read raises: the masked index does, the sorted gather does not
    import pytest
    import torch

    from hybrid_attention.evaluation.recall import query_positions

    y = torch.empty(4, 32, dtype=torch.long, device="meta")
    h = torch.empty(4, 32, 16, device="meta")
    pos = query_positions(y, 3)
    assert h.gather(1, pos[..., None].expand(-1, -1, 16)).flatten(0, 1).shape == (12, 16)
    assert y.gather(1, pos).flatten().shape == (12,)
    with pytest.raises((RuntimeError, NotImplementedError)):
        h[y != -100]


def test_cuda_training_step_makes_no_sync():
    # CUDA only: the trainer's step (sync-free gather, clipping, AdamW, schedule) on device-resident batches raises
    # on any synchronising call
    import pytest
    import torch

    from hybrid_attention.training import recall

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (sync debug mode)")
    cfg = RecallConfig(vocab_size=128, seq_len=64, num_kv_pairs=3, model_options={"chunk_size": 16})
    x, y = recall.make_examples(cfg, 8, seed=1)
    n = recall.labels_per_row(y)
    x, y = x.cuda(), y.cuda()
    for mixer in ("softmax", "gdn"):
        model = recall.build_recall_model(cfg, mixer, 32).cuda()
        opt, sched = recall.recall_optimizer(cfg, model, 1e-3)
        recall.train_step(model, model.model, opt, sched, x, y, n)  # warm-up: kernels, allocator, optimizer state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            recall.train_step(model, model.model, opt, sched, x, y, n)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def test_train_and_eval_applies_the_tf32_it_records(monkeypatch):
    # the experiment runner calls train_and_eval directly: the TF32 setting its row records must be the one applied
    import torch

    from hybrid_attention.training import recall

    seen = []
    monkeypatch.setattr(recall, "set_tf32", lambda device, enabled: seen.append(enabled))
    cfg = RecallConfig(vocab_size=64, seq_len=32, num_kv_pairs=3, train_examples=16, test_examples=8, batch_size=8,
                       epochs=1, device="cpu")
    for flag in (False, True):
        cfg.tf32 = flag
        row = recall.train_and_eval(cfg, "softmax", 16, 1e-3, torch.device("cpu"))
        assert seen[-1] is flag and row["tf32"] is flag


@pytest.mark.parametrize("fresh", [True, False])
def test_length_curriculum_trains_short_then_full(monkeypatch, fresh):
    # short_seq_len / short_epochs: the first epochs train on shorter examples (fresh ones per epoch, or one fixed
    # set regenerated once at the switch), the test set and the later epochs are at seq_len
    import torch

    from hybrid_attention.training import recall

    made, stepped, real_make, real_step = [], [], recall.make_examples, recall.train_step

    def making(cfg, n, seed, seq_len=None, num_kv_pairs=None):
        x, y = real_make(cfg, n, seed, seq_len, num_kv_pairs)
        made.append((n, seed, x.shape[1]))
        return x, y

    def stepping(model, backbone, opt, sched, xb, yb, n=None):
        stepped.append(xb.shape[1])
        return real_step(model, backbone, opt, sched, xb, yb, n)

    monkeypatch.setattr(recall, "make_examples", making)
    monkeypatch.setattr(recall, "train_step", stepping)
    cfg = RecallConfig(task="passkey", vocab_size=32, seq_len=40, short_seq_len=24, short_epochs=2, epochs=3,
                       train_examples=32, test_examples=16, batch_size=16, fresh_data=fresh, early_stop=2.0,
                       device="cpu")
    row = recall.train_and_eval(cfg, "softmax", 16, 3e-3, torch.device("cpu"))
    assert row["epochs"] == 3 and stepped == [24, 24, 24, 24, 40, 40]  # 2 steps per epoch
    if fresh:
        want = [(16, 10_000, 40), (32, 0, 24), (32, 7919 * 2, 24), (32, 7919 * 3, 40)]
    else:
        want = [(16, 10_000, 40), (32, 0, 24), (32, 0, 40)]
    assert sorted(made) == sorted(want)
    assert [cfg.train_seq_len(e) for e in (1, 2, 3)] == [24, 24, 40]


def test_mqar_curriculum_over_pairs_trains_the_short_stage_on_fewer_pairs(monkeypatch):
    # short_num_kv_pairs: the short stage's examples hold that many pairs (and queries), the later ones and the test
    # set num_kv_pairs; each epoch's history names its pairs
    import torch

    from hybrid_attention.training import recall

    made, real_make = [], recall.make_examples

    def making(cfg, n, seed, seq_len=None, num_kv_pairs=None):
        x, y = real_make(cfg, n, seed, seq_len, num_kv_pairs)
        made.append((x.shape[1], int((y[0] != -100).sum())))
        return x, y

    monkeypatch.setattr(recall, "make_examples", making)
    cfg = RecallConfig(task="mqar", vocab_size=128, seq_len=48, num_kv_pairs=8, short_seq_len=24, short_epochs=2,
                       short_num_kv_pairs=3, epochs=3, train_examples=32, test_examples=16, batch_size=16,
                       fresh_data=True, early_stop=2.0, device="cpu")
    row = recall.train_and_eval(cfg, "softmax", 16, 3e-3, torch.device("cpu"))
    assert sorted(made) == sorted([(48, 8), (24, 3), (24, 3), (48, 8)])  # test set, epochs 1, 2, 3
    assert [(h["seq_len"], h["num_kv_pairs"]) for h in row["history"]] == [(24, 3), (24, 3), (48, 8)]
    assert [cfg.train_num_kv_pairs(e) for e in (1, 2, 3)] == [3, 3, 8]


@pytest.mark.parametrize("bad", [{"task": "passkey"}, {"short_seq_len": None, "short_epochs": 0},
                                 {"short_num_kv_pairs": 0}])
def test_short_num_kv_pairs_needs_an_mqar_curriculum(bad):
    from hybrid_attention.config.schema import ConfigError

    kw = {"task": "mqar", "vocab_size": 128, "seq_len": 64, "num_kv_pairs": 8, "short_seq_len": 32,
          "short_epochs": 2, "short_num_kv_pairs": 4, "epochs": 6}
    RecallConfig(**kw)  # the valid one
    with pytest.raises(ConfigError, match="^config error: short_num_kv_pairs must be a positive count"):
        RecallConfig(**{**kw, **bad})
    # the short stage's pairs must fit its length (4 x 9 > 32): refused when read, naming the short length
    with pytest.raises(ConfigError, match="^config error: short_seq_len = 32 does not fit mqar: 4 \\* num_kv_pairs"):
        RecallConfig(**{**kw, "short_num_kv_pairs": 9})


@pytest.mark.parametrize("bad, field", [({"short_seq_len": 64}, "short_seq_len"),
                                        ({"short_seq_len": 0}, "short_seq_len"),
                                        ({"short_seq_len": 32, "short_epochs": 0}, "short_epochs"),
                                        ({"short_seq_len": 32, "short_epochs": 6}, "short_epochs"),
                                        ({"short_epochs": 2}, "short_epochs")])
def test_length_curriculum_rejects_bad_settings(bad, field):
    from hybrid_attention.config.schema import ConfigError

    with pytest.raises(ConfigError, match=f"^config error: {field} "):
        RecallConfig(seq_len=64, epochs=6, **bad)


@pytest.mark.parametrize("lengths, field", [({"seq_len": 28}, "seq_len"),
                                            ({"seq_len": 64, "short_seq_len": 24, "short_epochs": 2}, "short_seq_len")])
def test_mqar_lengths_must_hold_the_pairs_and_queries(lengths, field):
    """8 pairs and 8 queries need 32 tokens, and the vocabulary must exceed the length: refused when the config is
    read, not at the curriculum's first epoch."""
    from hybrid_attention.config.schema import ConfigError

    with pytest.raises(ConfigError, match=f"^config error: {field} = \\d+ does not fit mqar: 4 \\* num_kv_pairs"):
        RecallConfig(task="mqar", num_kv_pairs=8, epochs=6, **lengths)
    RecallConfig(task="passkey", num_kv_pairs=8, epochs=6, **lengths)  # passkey has no pairs
    with pytest.raises(ConfigError, match=r"^config error: seq_len = 64 does not fit mqar: vocab_size \(64\)"):
        RecallConfig(task="mqar", vocab_size=64, seq_len=64, num_kv_pairs=4)
