import io
import logging

from fedagg.runtime.progress import RoundProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _logged_rounds(caplog) -> list[str]:
    return [r.getMessage().split(" ")[1] for r in caplog.records if r.getMessage().startswith("round ")]


def test_off_a_terminal_progress_is_logged_lines_throttled_plus_the_last_round(caplog):
    caplog.set_level(logging.INFO, logger="fedagg")
    stream = io.StringIO()
    progress = RoundProgress(first=1, total=5, log_interval_s=3600, stream=stream)
    for r in range(1, 6):
        progress.update(r, test_acc=0.5 if r % 2 else None, train_loss=1.25)
    progress.close()
    assert _logged_rounds(caplog) == ["1/5", "5/5"]  # the first line at once, then only the last within the hour
    assert "acc=0.5000 loss=1.2500" in caplog.records[-1].getMessage()
    assert "\r" not in stream.getvalue()


def test_a_zero_interval_logs_every_round_and_a_resumed_run_counts_from_its_first_round(caplog):
    caplog.set_level(logging.INFO, logger="fedagg")
    progress = RoundProgress(first=4, total=6, log_interval_s=0, stream=io.StringIO())
    for r in (4, 5, 6):
        progress.update(r, test_acc=None, train_loss=0.5)
    assert _logged_rounds(caplog) == ["4/6", "5/6", "6/6"]


def test_on_a_terminal_a_bar_is_drawn_and_nothing_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="fedagg")
    stream = Terminal()
    progress = RoundProgress(first=1, total=2, stream=stream)
    progress.update(1, test_acc=0.25, train_loss=1.0)
    progress.update(2, test_acc=0.75, train_loss=0.5)
    progress.close()
    assert _logged_rounds(caplog) == []
    assert "2/2" in stream.getvalue() and "acc=0.75" in stream.getvalue()


def test_round_loops_run_in_step_log_lines_even_on_a_terminal_and_their_group_draws_one_bar(caplog):
    """A stacked group's loops run in step (fedagg.loop.drivers.run_in_step): a bar each would stack one terminal
    line per run; they log lines, and their group draws one bar of the rounds it trains."""
    from fedagg.runtime.progress import GroupProgress

    caplog.set_level(logging.INFO, logger="fedagg")
    stream = Terminal()
    progress = RoundProgress(first=1, total=2, log_interval_s=0, stream=stream, bar=False)
    progress.update(1, test_acc=0.25, train_loss=1.0)
    progress.update(2, test_acc=0.75, train_loss=0.5)
    progress.close()
    assert _logged_rounds(caplog) == ["1/2", "2/2"] and stream.getvalue() == ""
    group = GroupProgress(stream=stream)
    for runs in (3, 3, 2):
        group.update(runs)
    group.close()
    assert "stacked rounds: 3" in stream.getvalue() and "runs=2" in stream.getvalue()
