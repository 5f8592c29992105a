"""Profile-table checks name the bad rows and never fill gaps; the store finds bundled sets."""

import numpy as np
import pandas as pd
import pytest

from fleetplan.models.errors import ProfileMissing
from fleetplan.profiler.store import ProfileStore
from fleetplan.profiler.tables import content_hash, from_frame


def frame(**overrides) -> pd.DataFrame:
    base = pd.DataFrame(
        {
            "model": ["m", "m"],
            "device": ["d", "d"],
            "tp": [1, 1],
            "batch": [1, 4],
            "prompt_tokens": [128, 128],
            "ttft_ms_p90": [10.0, 20.0],
            "tbt_ms_p90": [5.0, 6.0],
        }
    )
    for column, values in overrides.items():
        base[column] = values
    return base


def test_absent_percentiles_become_nan_columns_not_zeros():
    table = from_frame(frame(), "t")
    assert table.frame["ttft_ms_p50"].isna().all()
    assert (table.frame["ttft_ms_p90"] > 0).all()


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"ttft_ms_p90": [10.0, -1.0]}, "profiles.rows[1].ttft_ms_p90", "rows 1 (m/d/tp1/b4/p128)"),
        ({"tbt_ms_p90": [np.inf, 6.0]}, "profiles.rows[0].tbt_ms_p90", "rows 0"),
        ({"batch": [1, 0]}, "profiles.rows[1].batch", "positive integer"),
        ({"batch": [4, 4]}, "profiles", "duplicate"),
        ({"ttft_ms_p50": [11.0, 1.0]}, "profiles.rows[0].ttft_ms_p50", "ttft_ms_p50 > ttft_ms_p90"),
    ],
)
def test_checks_name_the_rows(overrides, field, fragment):
    with pytest.raises(ProfileMissing) as caught:
        from_frame(frame(**overrides), "t")
    assert caught.value.field == field
    assert fragment in caught.value.message


def test_missing_key_column_is_named():
    with pytest.raises(ProfileMissing, match="missing key column"):
        from_frame(frame().drop(columns="tp"), "t")


def test_hash_ignores_row_order():
    table = from_frame(frame(), "t")
    shuffled = from_frame(frame().iloc[::-1], "t")
    assert content_hash(table.frame) == content_hash(shuffled.frame)


def test_bundled_sets_and_manifest_hash():
    store = ProfileStore()
    assert {"paper", "synthetic"} <= set(store.names())
    assert store.load("paper").sha256 == store.manifest("paper").sha256


def test_unknown_set_names_the_known_ones():
    with pytest.raises(ProfileMissing, match="known sets") as caught:
        ProfileStore().load("nope")
    assert caught.value.field == "profiles.set"


def test_user_store_shadows_bundled_set(tmp_path):
    shadow = tmp_path / "paper"
    shadow.mkdir()
    frame().to_csv(shadow / "profile.csv", index=False)
    store = ProfileStore([ProfileStore().roots[0], tmp_path])
    assert len(store.load("paper").frame) == 2
