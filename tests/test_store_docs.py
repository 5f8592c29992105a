"""docs/store.md's scheduling examples and exit codes checked against the code: the cron line, the systemd
service and timer (systemd-analyze, where installed), the Kubernetes Secret and CronJob, and the exit codes
of `fleetplan replan`."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetplan.api.cli_store import EXIT_ERROR, EXIT_KEPT, EXIT_OK, replan_command
from fleetplan.store.engine import DATABASE_ENV

DOC = Path(__file__).resolve().parent.parent / "docs" / "store.md"


def _scheduling() -> str:
    text = DOC.read_text()
    return text[text.index("## Scheduling") :]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _scheduling(), re.S)


def _replan_options() -> set[str]:
    return {opt for param in replan_command.params for opt in param.opts if opt.startswith("--")}


def _check_replan_argv(argv: list[str]) -> None:
    """`fleetplan replan FLEET --option value ...`: every option is one `fleetplan replan` has."""
    at = next(i for i, word in enumerate(argv) if word == "fleetplan" or word.endswith("/bin/fleetplan"))
    assert argv[at + 1] == "replan"
    options = [word for word in argv[at + 2 :] if word.startswith("--")]
    assert options
    assert set(options) <= _replan_options(), set(options) - _replan_options()


def test_the_cron_line_is_five_fields_and_escapes_every_percent():
    (block,) = re.findall(r"\*\*cron\*\*.*?```\n(.*?)```", _scheduling(), re.S)
    (line,) = block.strip().splitlines()
    fields = line.split(None, 5)
    minute, hour = int(fields[0]), int(fields[1])
    assert (minute, hour, fields[2:5]) == (30, 2, ["*", "*", "*"])
    command = fields[5]
    assert command.count("%") == command.count("\\%") > 0  # an unescaped % ends the command in crontab
    assert command.startswith(f"{DATABASE_ENV}=postgresql+psycopg://")
    _check_replan_argv(shlex.split(command.split(">>")[0].replace("\\%", "%")))


def _units() -> dict[str, str]:
    return {block.splitlines()[0].lstrip("# ").strip(): block for block in _blocks("ini")}


def test_the_systemd_units_escape_for_systemd_and_treat_kept_as_success():
    units = _units()
    assert set(units) == {"fleetplan-replan@.service", "fleetplan-replan@.timer"}
    service = units["fleetplan-replan@.service"]
    (exec_start,) = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    # systemd itself expands % specifiers and $ variables: the shell's must be doubled
    assert "%%F" in exec_start
    assert "$$(" in exec_start
    assert re.search(r"(?<![%])%F", exec_start.replace("%%F", "")) is None
    _check_replan_argv(shlex.split(exec_start.removeprefix("ExecStart="))[2].split())
    assert f"SuccessExitStatus={EXIT_KEPT}" in service.splitlines()
    assert "OnCalendar=*-*-* 02:30:00" in units["fleetplan-replan@.timer"].splitlines()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    names = []
    for name, text in _units().items():
        instance = tmp_path / name.replace("@.", "@web.")
        instance.write_text(text)
        names.append(str(instance))
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names], capture_output=True, text=True, timeout=60
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr.strip() == ""  # a value systemd cannot parse is only a message here
    calendar = subprocess.run(
        ["systemd-analyze", "calendar", "*-*-* 02:30:00"], capture_output=True, text=True, timeout=60
    )
    assert calendar.returncode == 0, calendar.stderr


def test_the_kubernetes_cronjob_reads_the_database_url_from_the_secret():
    (block,) = _blocks("yaml")
    secret, cronjob = yaml.safe_load_all(block)
    assert (secret["kind"], cronjob["kind"]) == ("Secret", "CronJob")
    assert cronjob["apiVersion"] == "batch/v1"
    spec = cronjob["spec"]
    assert len(spec["schedule"].split()) == 5
    assert spec["concurrencyPolicy"] == "Forbid"  # one re-plan of a fleet at a time (a second is refused)
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    _check_replan_argv(container["command"])
    (env,) = container["env"]
    assert env["name"] == DATABASE_ENV
    ref = env["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    assert secret["stringData"][ref["key"]].startswith("postgresql+psycopg://")
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts == {v["name"] for v in pod["volumes"]}


def test_the_exit_code_table_is_the_cli_s():
    text = DOC.read_text()
    table = text[text.index("## Exit codes") : text.index("## Scheduling")]
    rows = [line.split("|")[1:3] for line in table.splitlines() if re.match(r"\| \d \|", line)]
    documented = {int(code): status for code, status in rows}
    assert set(documented) == {EXIT_OK, EXIT_KEPT, EXIT_ERROR}
    assert "`promoted`" in documented[EXIT_OK]
    assert "`unchanged`" in documented[EXIT_OK]
    assert "`kept`" in documented[EXIT_KEPT]
    assert "`failed`" in documented[EXIT_ERROR]
