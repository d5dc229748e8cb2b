"""data.pack: varlen — document boundaries of packed rows and the flattened inputs."""

from __future__ import annotations

import torch

from hybrid_attention.data.packing import document_offsets, varlen_inputs

SEP = 9


def test_document_offsets_per_row_and_separator() -> None:
    rows = torch.tensor([[1, 2, SEP, 3, 4, 5], [6, SEP, 7, 8, 9 - 1, SEP]])
    # row 0: [1 2 SEP] [3 4 5 (cut)]; row 1: [6 SEP] [7 8 8 SEP]; the final separator ends the row: no empty document
    assert document_offsets(rows, SEP).tolist() == [0, 3, 6, 8, 12]
    assert document_offsets(rows, SEP).dtype == torch.int32


def test_varlen_inputs_keep_the_concat_targets() -> None:
    rows = torch.tensor([[1, 2, SEP, 3], [4, SEP, 5, 6]])
    ids, labels, cu = varlen_inputs(rows, SEP)
    assert ids.tolist() == [[1, 2, SEP, 3, 4, SEP, 5, 6]]
    assert labels.tolist() == [[1, 2, SEP, 3, -100, SEP, 5, 6]]  # row 0 never predicts row 1's first token
    assert cu.tolist() == [0, 3, 4, 6, 8]
