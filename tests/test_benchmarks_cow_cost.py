"""benchmarks/cow_cost.py's pure parts: reading perf report's output."""

from benchmarks import cow_cost

COMMS = """# Overhead  Samples  Command
#
    97.84%    97.84%         46978  forkserve: work
     2.06%     2.06%           991  swapper
"""

CHILDREN = """# Children      Self  Symbol
    30.63%     0.00%  [k] asm_exc_page_fault
    27.97%     0.71%  [k] do_wp_page
    23.87%    23.86%  [k] copy_mc_enhanced_fast_string
    12.93%    12.88%  [.] _PyEval_EvalFrameDefault
"""


def test_the_workers_samples_are_found_by_their_title():
    assert cow_cost.comm_samples(COMMS.splitlines(), cow_cost.WORKER_COMM) == 46978
    assert cow_cost.comm_samples(COMMS.splitlines(), "gunicorn") == 0


def test_children_shares_are_read_per_symbol():
    found = cow_cost.symbol_shares(CHILDREN.splitlines())
    assert round(found[cow_cost.FAULT], 4) == 0.3063 and round(found[cow_cost.COW], 4) == 0.2797
    assert round(found["copy_mc_enhanced_fast_string"], 4) == 0.2387
    assert "Symbol" not in found
