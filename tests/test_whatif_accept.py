"""POST /whatif's answer form by `Accept` (q-values, wildcards) and ?plot=, and the 406 where none fits."""

import pytest

from fleetplan.api.whatif import _form
from fleetplan.models.errors import NotAcceptable


@pytest.mark.parametrize(
    ("accept", "plot", "form"),
    [
        ("", "frontier", "image/svg+xml"),
        ("*/*", "frontier", "image/svg+xml"),
        ("image/png", "devices", "image/png"),
        ("image/png;q=1, image/svg+xml;q=0.1", "frontier", "image/png"),
        ("image/*", "frontier", "image/svg+xml"),
        ("", None, "application/json"),
        ("text/csv", None, "text/csv"),
        ("text/csv;q=0.5, application/json", None, "application/json"),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", None, "application/json"),
    ],
)
def test_the_answer_form_follows_accept_with_its_q_values(accept, plot, form):
    assert _form(accept, plot) == form


@pytest.mark.parametrize(
    ("accept", "plot", "says"),
    [
        ("application/json", "frontier", "image/svg+xml or image/png"),
        ("image/gif", "heatmap", "?plot=heatmap answers"),
        ("image/png", None, "a picture needs ?plot=frontier|devices|heatmap"),
    ],
)
def test_an_accept_that_takes_no_form_is_not_acceptable(accept, plot, says):
    with pytest.raises(NotAcceptable) as raised:
        _form(accept, plot)
    assert raised.value.status_code == 406
    assert raised.value.field == "accept"
    assert says in raised.value.message
