"""benchmarks/xdist_order.py: the worksteal replay and the two test orders it compares."""

from __future__ import annotations

from benchmarks import xdist_order


def test_a_worker_runs_the_two_tests_it_holds_back_to_back():
    """Two workers, four tests: worker 0 holds the two long ones; neither can be stolen (xdist keeps two)."""
    assert xdist_order.makespan([50.0, 40.0, 1.0, 1.0], workers=2, startup=5.0) == 95.0
    assert xdist_order.makespan([50.0, 1.0, 40.0, 1.0], workers=2, startup=5.0) == 56.0


def test_an_idle_worker_steals_from_the_tail_of_the_longest_queue():
    """Worker 0 holds 1, 10, 10 s; worker 1 four 10 s tests.  At 11 s worker 0 has one test left and steals
    worker 1's last (half its three, keeping two): both end by 31 s, where worker 1 alone would end at 40 s."""
    assert xdist_order.makespan([1.0] + [10.0] * 6, workers=2, startup=0.0) == 31.0


def test_dtype_major_puts_a_propertys_shards_a_dtype_block_apart():
    seconds = {f"{name}[{dtype}]": 1.0 for name in ("test_out_within_error_model", "test_varlen_outputs_within_error_model")
               for dtype in ("float16", "float32")}
    orders = xdist_order.orders(seconds, ("float16", "float32"), workers=2, estimates={})
    assert orders["collected"][:2] == ["test_out_within_error_model[float16]", "test_out_within_error_model[float32]"]
    assert orders["dtype-major"] == ["test_out_within_error_model[float16]", "test_varlen_outputs_within_error_model[float16]",
                                     "test_out_within_error_model[float32]", "test_varlen_outputs_within_error_model[float32]"]


def test_balanced_orders_are_replayed_on_each_set_of_estimates():
    seconds = {f"test_out_within_error_model[{dtype}]": value for dtype, value in (("float16", 9.0), ("float32", 1.0))}
    orders = xdist_order.orders(seconds, ("float16", "float32"), workers=2, estimates={"own": seconds, "none": {}})
    assert set(orders) == {"collected", "dtype-major", "balanced, own"}
    assert sorted(orders["balanced, own"]) == sorted(seconds)
