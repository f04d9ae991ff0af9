"""`Agent.template()` (SPEC §6) against a real daemon: the prompt comes from
prompts/<name>/<version>.txt where the program runs, its model call carries the template's id,
replay hands back the same text with nothing live, and a fork's `prompt:planner=v2` edit hands
the planner version 2 (the model call then runs live: it changed). Variables are keyword
arguments (`template(table="users")`, as in SPEC §6) or a dict."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import retrace as sdk
from daemons import free_port, started
from test_checks import daemon  # noqa: F401 - the fixture

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))
PROG = [sys.executable, str(HERE / "template_prog.py")]


def retrace(home, cwd, *args, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_") and not k.startswith("OPENAI_")}
    env.update(RETRACE_HOME=str(home), OPENAI_API_KEY="sk-test-template-never-stored",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    r = subprocess.run([BIN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise AssertionError(f"retrace {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def test_template_versions_replay_and_fork(tmp_path):
    project, home = tmp_path / "project", tmp_path / "home"
    (project / "prompts" / "planner").mkdir(parents=True)
    (project / "prompts" / "planner" / "v1.txt").write_text("Plan the rename of {table}.full_name.")
    (project / "prompts" / "planner" / "v2.txt").write_text("Plan the rename of {table}.full_name in batches.")
    port = free_port()
    sim = started(["simulate", "--addr", f"127.0.0.1:{port}"], port, dict(os.environ))
    try:
        upstream = f"http://127.0.0.1:{port}/v1"
        rec = retrace(home, project, "record", "--json", "--upstream-openai", upstream, "--", *PROG)
        *printed, last = rec.stdout.strip().splitlines()
        run = json.loads(last)["run"]
        assert printed == ["Plan the rename of users.full_name."], rec.stdout
        show = retrace(home, project, "show", run, "--json").stdout
        assert "planner@v1" in show, show

        fork = retrace(home, project, "fork", run, "--edit", "prompt:planner=v2", "--upstream-openai", upstream)
        assert "Plan the rename of users.full_name in batches." in fork.stdout, fork.stdout + fork.stderr
    finally:
        sim.terminate()
        sim.wait(timeout=10)

    rep = retrace(home, project, "replay", run)
    assert rep.stdout.strip().splitlines() == printed, rep.stdout + rep.stderr


def test_template_variables_are_keywords_or_a_dict(daemon, tmp_path):
    (tmp_path / "prompts" / "planner").mkdir(parents=True)
    (tmp_path / "prompts" / "planner" / "v3.txt").write_text("Rename {table}.{column} in {n} batches, {template}.")
    run = sdk.connect(url=daemon, name="template-vars")
    planner = run.agent("planner", prompt_template="planner@v3")
    want = "Rename users.full_name in 3 batches, v3."
    assert planner.template(table="users", column="full_name", n=3, vars={"template": "v3"}) == want
    assert planner.template({"table": "users", "column": "full_name", "n": 3, "template": "v3"}) == want
    assert planner.template({"table": "users", "template": "v3"}, column="full_name", n=3) == want
    assert asyncio.run(planner.atemplate({"template": "v3"}, table="users", column="full_name", n=3)) == want
    # One pass: a value that holds a placeholder is inserted as it is, never filled again.
    assert planner.template(table="{column}", column="c", n=1, vars={"template": "t"}) == "Rename {column}.c in 1 batches, t."
    with pytest.raises(sdk.RetraceError) as missing:
        planner.template(table="users", n=3, vars={"template": "v3"})
    assert missing.value.code == "template_var", missing.value
    assert "placeholder {column} on line 1 has no value (given: n, table, template)" in str(missing.value)
    run.finish()


def test_templates_come_from_the_programs_folder_not_the_daemons(daemon, tmp_path, monkeypatch):
    """The daemon was started elsewhere (its RETRACE_PROMPTS has no planner@v4); the program
    runs in its own folder, which has."""
    project = tmp_path / "elsewhere"
    (project / "prompts" / "planner").mkdir(parents=True)
    (project / "prompts" / "planner" / "v4.txt").write_text("Backfill {table} from the program's folder.")
    monkeypatch.chdir(project)
    run = sdk.connect(url=daemon, name="template-folder")
    assert run.agent("planner", prompt_template="planner@v4").template(table="users") == \
        "Backfill users from the program's folder."
    run.finish()
