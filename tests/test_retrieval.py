"""The retrieval proposer without a model: suffix matches, their order, the incremental index, the calibration."""
import math

from core.retrieval import MAX_MATCH, PRIOR, Calibration, SuffixIndex


def index_of(tokens, max_n=4):
    index = SuffixIndex(max_n)
    index.sync(tokens)
    return index


def test_longest_match_first_then_most_recent():
    #         0  1  2  3  4  5  6  7  8  9 10
    tokens = [5, 1, 2, 3, 9, 7, 2, 3, 8, 1, 2]
    index = index_of(tokens)
    found = index.continuations([1, 2], depth=3)
    # [1, 2] ends at 2 (then 3, 9, 7); the one-token suffix [2] also ends at 6 (then 3 ...: same first token, skipped)
    assert [(m.tokens, m.length) for m in found] == [((3, 9, 7), 2)]
    found = index.continuations([4, 2], depth=2, max_candidates=4)
    assert [(m.tokens, m.length) for m in found] == [((3, 8), 1)]        # the most recent [2] first; 3 already seen
    found = index.continuations([3], depth=2, max_candidates=4)
    assert [(m.tokens, m.length) for m in found] == [((8, 1), 1), ((9, 7), 1)]


def test_nothing_follows_the_last_token_and_limits_hold():
    index = index_of([1, 2, 3])
    assert index.continuations([2, 3], depth=4) == []                    # [2, 3] only ends the list
    assert index.continuations([1], depth=0) == []
    assert [m.tokens for m in index.continuations([1], depth=1)] == [(2,)]
    index = index_of([7, 1, 7, 2, 7, 3, 7])
    assert len(index.continuations([7], depth=2, max_candidates=2)) == 2
    assert [m.tokens[0] for m in index.continuations([7], depth=2, max_candidates=5)] == [3, 2, 1]


def test_incremental_index_equals_a_fresh_one_and_a_new_history_reindexes():
    tokens = [int(t) for t in "3141592653589793238462643383279502884197"]
    grown = SuffixIndex()
    for n in range(1, len(tokens) + 1, 3):
        grown.sync(tokens[:n])
    grown.sync(tokens)
    assert grown.ends == index_of(tokens).ends and grown.tokens == tokens
    grown.sync([9, 9, 9])                                                 # not an extension: starts again
    assert grown.tokens == [9, 9, 9] and grown.ends == index_of([9, 9, 9]).ends


def test_calibration_counts_only_nodes_whose_parent_was_accepted():
    cal = Calibration()
    assert math.isclose(cal.logp(1), math.log(PRIOR[0])) and cal.logp(99) == cal.logp(MAX_MATCH)
    # tree: 0 -> 1 (retrieved, m=2) -> 2 (retrieved, m=3); 0 -> 3 (drafter); 3 -> 4 (retrieved, m=1)
    parents, lengths = [-1, 0, 1, 0, 3], [0, 2, 3, 0, 1]
    for _ in range(50):
        cal.update(parents, accepted=[0, 1], lengths=lengths)
    assert cal.logp(2) > math.log(0.95)        # node 1 accepted every time
    assert cal.logp(3) < math.log(0.05)        # node 2 tried (parent accepted) and rejected every time
    assert math.isclose(cal.logp(1), math.log(PRIOR[0]))   # node 4's parent was never accepted: no trial
