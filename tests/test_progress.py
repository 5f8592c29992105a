"""The one progress bar (fleetplan.progress) and the profile runner's counting on top of it."""

from fleetplan.profiler.runner import _progress
from fleetplan.progress import progress_bar


def test_the_bar_shows_the_count_on_stderr(capsys):
    with progress_bar("what-if points", True) as update:
        for done in range(1, 6):
            update(done, 5)
    err = capsys.readouterr().err
    assert "what-if points" in err
    assert "5/5" in err


def test_a_hidden_bar_draws_nothing(capsys):
    with progress_bar("hidden", False) as update:
        update(1, 2)
    assert capsys.readouterr().err == ""


def test_the_runner_resumes_its_count(capsys):
    with _progress(total=4, done=2, show=True, label="est gpu") as advance:
        advance()
        advance()
    err = capsys.readouterr().err
    assert "4/4" in err
    assert "5/4" not in err
