"""benchmarks/client_capacity.py's level rule, the same for every client: a level where the
synthetic server fell behind its own schedule is void (neither pass nor fail), and a client's
capacity is its highest passing level whose server kept up."""

import importlib.util
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCH))  # client_capacity.py reads its siblings _common.py and peers.py
_spec = importlib.util.spec_from_file_location("client_capacity", _BENCH / "client_capacity.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def _row(rate, err, server_late, failed=0):
    errs = {"icl_err_ms": [err] * 100, "late_ms": [], "ttft_err_ms": [], "mismatched": 0, "missing": 0}
    records = {"p": [(0, [int((5 + server_late) * 1e6)])]}  # one write, server_late ms after its due time
    args = type("A", (), {"ttft_ms": 5.0})()
    row = cc.summarize(rate, 1.0, rate, 10, failed, errs, records, args, 0.5, {"cpu_share": None, "lag_p99": None})
    row["streamed"] = rate * 0.9
    return row


def test_a_level_whose_server_fell_behind_is_void_even_when_the_client_timed_it_well():
    ok, late_ok, void, bad = _row(1e5, 0.1, 1.0), _row(1e5, 0.1, 2.0), _row(2e5, 0.1, 9.4), _row(1e5, 3.0, 1.0)
    assert cc.verdict(ok) == "pass" and cc.passed(ok)
    assert cc.verdict(late_ok) == "pass"  # 2 ms late is still keeping up
    assert cc.verdict(void) == "void: server late p99 9.400 ms > 2" and not cc.passed(void)
    assert cc.verdict(bad).startswith("FAIL: timing error p99 3.000 ms") and not cc.passed(bad)
    assert cc.verdict(_row(2e5, 3.0, 9.4)).startswith("void")  # nor is a failure counted there
    assert not cc.passed(_row(1e5, 0.1, 1.0, failed=1))


def test_same_level_table_puts_every_client_side_by_side():
    results = {"a": [_row(1e5, 0.1, 1.0), _row(1.5e5, 0.2, 3.0)], "b": [_row(1e5, 0.05, 1.0)]}
    headers, rows = cc.same_level_table(["a", "b"], results)
    assert headers == ["configured tok/s", "a", "b"]
    assert rows == [["100000", "90000 0.100 pass", "90000 0.050 pass"], ["150000", "135000 0.200 void", "-"]]
