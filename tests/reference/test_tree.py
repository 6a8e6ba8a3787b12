"""Tree verification and cache bookkeeping against straightforward recomputation."""

from __future__ import annotations

import torch

from specconvert.reference import DecodeSettings, DraftTree, TreeShape

from .conftest import EOS


def _prefilled(dec, prompt):
    target = dec.target
    target.reset()
    out = target.forward(torch.tensor(prompt), torch.arange(len(prompt)), logits_to_keep=1)
    tok = int(out.logits[-1].argmax())
    dec._eagle.reset()
    dec._eagle.commit(out.aux, torch.tensor(prompt[1:] + [tok]))
    return tok


def test_dynamic_tree_is_connected_and_ordered(eagle_dec):
    _prefilled(eagle_dec, [5, 9, 33, 70])
    tree = eagle_dec._eagle.draft(TreeShape(top_k=4, depth=4, total_tokens=24))
    assert tree.size == 23
    parents, depths = tree.parents, tree.depths
    assert (parents < torch.arange(tree.size)).all()  # parents come first
    has_parent = parents >= 0
    assert (depths[has_parent] == depths[parents[has_parent]] + 1).all()
    assert (depths[~has_parent] == 1).all()
    assert int(depths.max()) == 4 and int((depths == 1).sum()) == 4
    # siblings are distinct target tokens
    for p in set(parents.tolist()):
        sib = tree.tokens[parents == p]
        assert sib.unique().numel() == sib.numel()
    # ancestor mask: row i covers exactly its depth + 1 (root) entries
    assert (tree.ancestors[1:].sum(1) == depths + 1).all()


def test_tree_forward_equals_each_path_alone(eagle_dec):
    prompt = [7, 100, 3, 250, 18, 42]
    root = _prefilled(eagle_dec, prompt)
    tree = eagle_dec._eagle.draft(TreeShape(top_k=3, depth=3, total_tokens=12))
    assert len(tree.paths()) >= 3
    target = eagle_dec.target
    n = len(prompt)

    def prefix():
        target.reset()
        target.forward(torch.tensor(prompt), torch.arange(n), logits_to_keep=1)

    prefix()
    ids = torch.cat((torch.tensor([root]), tree.tokens))
    positions = n + torch.cat((torch.zeros(1, dtype=torch.long), tree.depths))
    out = target.forward(ids, positions, tree_mask=tree.ancestors)
    for path in tree.paths():
        prefix()
        alone = target.forward(ids[path], n + torch.arange(len(path)))
        torch.testing.assert_close(out.logits[path], alone.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.aux[path], alone.aux, rtol=1e-4, atol=1e-4)


def test_tree_forward_fails_without_the_mask(eagle_dec):
    """Sanity check of the test above: causal attention over the flattened tree differs."""
    prompt = [7, 100, 3, 250, 18, 42]
    root = _prefilled(eagle_dec, prompt)
    tree = eagle_dec._eagle.draft(TreeShape(top_k=3, depth=3, total_tokens=12))
    target, n = eagle_dec.target, len(prompt)
    target.reset()
    target.forward(torch.tensor(prompt), torch.arange(n), logits_to_keep=1)
    ids = torch.cat((torch.tensor([root]), tree.tokens))
    positions = n + torch.cat((torch.zeros(1, dtype=torch.long), tree.depths))
    wrong = target.forward(ids, positions, tree_mask=torch.ones(ids.numel(), ids.numel(), dtype=torch.bool).tril())
    path = max(tree.paths(), key=len)
    target.reset()
    target.forward(torch.tensor(prompt), torch.arange(n), logits_to_keep=1)
    alone = target.forward(ids[path], n + torch.arange(len(path)))
    assert (wrong.logits[path] - alone.logits).abs().max() > 1e-3


def _cache_tensors(target):
    return [(layer.keys[0], layer.values[0]) for layer in target.cache.layers]


def test_target_cache_after_acceptance_equals_fresh_prefill(oracle_dec, pair):
    """After every step, the target cache equals a fresh prefill of the text so far."""
    from specconvert.reference import ReferenceDecoder

    fresh = ReferenceDecoder.from_dirs(pair.target_dir, pair.draft_dir, [1, 3, 4])
    prompt = [11, 12, 13, 99, 4]
    settings = DecodeSettings(tree=dict(top_k=3, depth=4, total_tokens=14), stop_token_ids=(EOS,))
    oracle_dec._oracle.corrupt_every = 3
    try:
        emitted: list[int] = []
        gathers = 0
        for step in oracle_dec.stream(prompt, 30, settings):
            emitted += step.token_ids
            if step.finished:
                break
            text = prompt + emitted[:-1]
            got = _cache_tensors(oracle_dec.target)
            fresh.target.reset()
            fresh.target.forward(torch.tensor(text), torch.arange(len(text)), logits_to_keep=1)
            want = _cache_tensors(fresh.target)
            assert oracle_dec.target.length == len(text)
            for (gk, gv), (wk, wv) in zip(got, want):
                torch.testing.assert_close(gk, wk, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(gv, wv, rtol=1e-4, atol=1e-5)
            gathers += step.kind == "spec" and 0 < step.accepted
        assert gathers >= 2
    finally:
        oracle_dec._oracle.corrupt_every = 0


def test_draft_cache_in_step_with_target(eagle_dec, pair):
    from specconvert.reference import ReferenceDecoder

    fresh = ReferenceDecoder.from_dirs(pair.target_dir, pair.draft_dir, [1, 3, 4])
    prompt = [40, 41, 42, 43]
    settings = DecodeSettings(tree=dict(top_k=2, depth=3, total_tokens=6))
    emitted: list[int] = []
    for step in eagle_dec.stream(prompt, 12, settings):
        emitted += step.token_ids
        if step.finished:
            break
        eagle = eagle_dec._eagle
        assert eagle.committed == eagle_dec.target.length
        text = prompt + emitted
        fresh.target.reset()
        out = fresh.target.forward(torch.tensor(text[:-1]), torch.arange(len(text) - 1), logits_to_keep=1)
        fresh._eagle.reset()
        fresh._eagle.commit(out.aux, torch.tensor(text[1:]))
        n = eagle.committed
        torch.testing.assert_close(eagle.cache.k[:, :, :n], fresh._eagle.cache.k[:, :, :n], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(eagle.cache.v[:, :, :n], fresh._eagle.cache.v[:, :, :n], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(eagle._last_hidden, fresh._eagle._last_hidden, rtol=1e-4, atol=1e-4)


def test_empty_tree_is_a_plain_step():
    tree = DraftTree.empty()
    assert tree.size == 0 and tree.ancestors.shape == (1, 1) and tree.paths() == [[0]]
