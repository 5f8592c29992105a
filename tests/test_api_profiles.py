"""POST /profiles: upload, validation naming the bad rows, the replace policy, and planning from an
uploaded set; GET /profiles and GET /profiles/{name} list it."""

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from test_api import ROWS, inline_request

from fleetplan.api.app import create_app
from fleetplan.api.errors import PROBLEM_JSON
from fleetplan.api.settings import Settings
from fleetplan.profiler.store import ProfileStore, bundled_root

TOKEN = "test-token"


def upload(name: str = "uploaded", rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "description": "uploaded in a test",
        "rows": copy.deepcopy(ROWS if rows is None else rows),
        "sources": {"who": "tests/test_api_profiles.py"},
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def client(root: Path) -> Iterator[TestClient]:
    app = create_app(ProfileStore([bundled_root()], writable=root), settings=Settings(api_token=TOKEN))
    with TestClient(app=app) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    return response.json()


def test_upload_then_list_get_and_plan(client: TestClient, root: Path) -> None:
    response = client.post("/profiles", json=upload())
    assert response.status_code == 201, response.text
    manifest = response.json()
    assert manifest["name"] == "uploaded"
    assert manifest["rows"] == len(ROWS)
    assert manifest["generator"] == "POST /profiles"
    assert manifest["sources"] == {"who": "tests/test_api_profiles.py"}
    assert (root / "uploaded").is_symlink()

    listed = {s["name"]: s for s in client.get("/profiles").json()}
    assert listed["uploaded"]["sha256"] == manifest["sha256"]
    assert "paper" in listed
    assert client.get("/profiles/uploaded").json() == manifest

    body = inline_request()
    body["profiles"] = {"set": "uploaded"}
    planned = client.post("/plan", json=body)
    assert planned.status_code == 200, planned.text
    assert planned.json()["profile_set"]["name"] == "uploaded"
    assert planned.json()["profile_set"]["sha256"] == manifest["sha256"]


def test_bad_row_type_names_the_field(client: TestClient, root: Path) -> None:
    rows = copy.deepcopy(ROWS)
    rows[3]["ttft_ms_p90"] = -5
    body = problem(client.post("/profiles", json=upload(rows=rows)), 400)
    assert body["field"] == "rows[3].ttft_ms_p90"
    assert body["detail"].startswith("rows[3].ttft_ms_p90: ")
    assert not root.exists() or "uploaded" not in ProfileStore([root]).names()


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (
            lambda rows: rows[2].update(
                batch=rows[0]["batch"], prompt_tokens=rows[0]["prompt_tokens"], device=rows[0]["device"]
            ),
            "duplicate (model, device, tp, batch, prompt_tokens): rows 0 (m1/gpu/tp1/b1/p128), 2",
        ),
        (lambda rows: rows[5].update(tbt_ms_p90=None), "no tbt_ms_p* figure: rows 5 (m1/acc/tp1/b1/p1024)"),
        (
            lambda rows: rows[1].update(ttft_ms_p50=500.0),
            "ttft_ms_p50 > ttft_ms_p90: rows 1 (m1/gpu/tp1/b1/p1024)",
        ),
    ],
)
def test_table_checks_name_the_rows(client: TestClient, mutate: Any, says: str) -> None:
    rows = copy.deepcopy(ROWS)
    mutate(rows)
    body = problem(client.post("/profiles", json=upload(rows=rows)), 400)
    assert body["field"] == "rows", body
    assert says in body["detail"], body


def test_existing_name_needs_replace_and_a_bad_replacement_keeps_the_old_set(client: TestClient) -> None:
    first = client.post("/profiles", json=upload()).json()
    conflict = problem(client.post("/profiles", json=upload()), 409)
    assert "replace=true" in conflict["detail"]
    assert (
        problem(client.post("/profiles", json=upload(rows=[]), params={"replace": "true"}), 400)["field"]
        == "rows"
    )
    rows = copy.deepcopy(ROWS)
    rows[0]["ttft_ms_p50"] = 999.0
    problem(client.post("/profiles?replace=true", json=upload(rows=rows)), 400)
    assert client.get("/profiles/uploaded").json()["sha256"] == first["sha256"]

    rows = copy.deepcopy(ROWS)
    rows[0]["ttft_ms_p90"] = 21
    replaced = client.post("/profiles?replace=true", json=upload(rows=rows))
    assert replaced.status_code == 201, replaced.text
    assert replaced.json()["sha256"] != first["sha256"]
    assert client.get("/profiles/uploaded").json()["sha256"] == replaced.json()["sha256"]


def test_no_writable_store_is_a_503_that_says_so() -> None:
    app = create_app(ProfileStore([bundled_root()]), settings=Settings(allow_anonymous_writes=True))
    with TestClient(app=app) as test_client:
        body = problem(test_client.post("/profiles", json=upload()), 503)
    assert "FLEETPLAN_PROFILE_STORE" in body["detail"]


def test_malformed_or_unknown_fields_are_400(client: TestClient) -> None:
    assert problem(client.post("/profiles", content=b"{", headers={"content-type": "application/json"}), 400)
    body = upload()
    body["colour"] = "red"
    assert "colour" in problem(client.post("/profiles", json=body), 400)["detail"]
    assert problem(client.post("/profiles", json=upload(name="../x")), 400)["field"] == "name"


def test_a_nan_in_an_upload_names_its_field_as_in_a_plan_request(client: TestClient) -> None:
    """Python's json.dumps writes NaN, which is not JSON: the problem names the row and column, not a
    byte offset (the same message POST /plan gives)."""
    rows = copy.deepcopy(ROWS)
    column = next(key for key, value in rows[1].items() if key.startswith("ttft_ms") and value is not None)
    rows[1][column] = float("nan")
    content = json.dumps(upload(rows=rows))  # allow_nan: writes the bare token NaN
    assert "NaN" in content
    body = problem(
        client.post("/profiles", content=content, headers={"content-type": "application/json"}), 400
    )
    assert body["field"] == f"rows[1].{column}"
    assert "NaN and Infinity are not JSON numbers" in body["detail"]


def test_openapi_documents_the_upload(client: TestClient) -> None:
    schema = client.get("/schema/openapi.json").json()
    operation = schema["paths"]["/profiles"]["post"]
    assert {"201", "400", "409", "503"} <= operation["responses"].keys()
    assert "ProfileUpload" in str(operation["requestBody"])


def test_one_damaged_set_does_not_fail_the_listing(client: TestClient, root: Path) -> None:
    """A set whose manifest.json is not JSON made GET /profiles answer 422 for every set."""
    assert client.post("/profiles", json=upload()).status_code == 201
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "profile.csv").write_text("model,device\n")
    (damaged / "manifest.json").write_text("{garbage")
    listing = client.get("/profiles")
    assert listing.status_code == 200, listing.text
    names = {s["name"] for s in listing.json()}
    assert {"uploaded", "paper", "synthetic"} <= names
    assert "damaged" not in names
    problem(client.get("/profiles/damaged"), 422)
