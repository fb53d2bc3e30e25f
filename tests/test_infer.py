"""`sirius infer` end to end: a local HF specialist (a tiny Llama built here from a config, random weights),
a generalist behind a real OpenAI-compatible HTTP server, the demo databases. Checked: the pipeline runs,
every candidate's lifecycle is traced, the winner's reasons are given, the output keeps its format --
not accuracy (the specialist is random)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fake_openai import FakeOpenAIServer

PARIS = "SELECT count(*) FROM customers WHERE city = 'Paris'"


def tiny_specialist(path):
    """The tiny random Llama of the sampler tests, saved as a model folder the CLI loads."""
    from test_samplers import _tiny_model

    model, tokenizer = _tiny_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def generalist(messages, i):
    """Scripted answers keyed on what the prompt asks; the HTTP exchange is real."""
    last = messages[-1]["content"]
    if "Which candidate answers the question correctly?" in last:
        return "A" if "'Paris'" in last.split("Candidate B")[0] else "B"
    if "SQLite error (verbatim):" in last:
        return f"```sql\n{PARIS}\n```"
    if "How many doctors" in last:  # the second question: every first attempt is broken
        if "Earlier attempts failed" in last:
            return "```sql\nSELECT count(*) FROM doctors\n```"
        return "```sql\nSELECT count(*) FROM physicians\n```"
    return [f"```sql\n{PARIS}\n```",
            "```sql\nSELECT count(*) FROM customers WHERE city = 'paris'\n``` (wrong case: a count of 0)",
            "```sql\nSELECT count(*) FROM customers\n```",
            "```sql\nSELECT count(*) FROM customers WHERE substr(city) = 'Paris'\n```"][i % 4]


@pytest.fixture(scope="module")
def specialist(tmp_path_factory):
    return tiny_specialist(tmp_path_factory.mktemp("specialist") / "tiny-llama")


def test_infer_end_to_end(tmp_path, demo_db_root, specialist):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "q1", "db_id": "retail", "question": "How many customers live in Paris?"})
                         + "\n" + json.dumps({"id": "q2", "db_id": "clinic", "question": "How many doctors are there?"})
                         + "\n")
    out = tmp_path / "answers.jsonl"
    with FakeOpenAIServer(generalist) as server:
        result = subprocess.run([sys.executable, "-m", "sirius_train.cli", "infer", "--db-root", str(demo_db_root),
                                 "--input", str(questions), "--output", str(out), "--specialist", str(specialist),
                                 "--n-specialist", "2", "--max-new-tokens", "8", "--generalist-url", server.url,
                                 "--generalist-model", "gen", "--n-generalist", "4", "--margin", "0.1", "--quiet"],
                                capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    traces = [json.loads(line) for line in (tmp_path / "answers.trace.jsonl").read_text().splitlines()]
    assert [a["id"] for a in answers] == ["q1", "q2"] == [t["id"] for t in traces]
    for a in answers:
        assert {"id", "sql", "source", "score", "db_id", "question", "decided_by", "why", "status"} <= set(a)

    q1, q2 = answers
    assert q1["sql"] == PARIS and q1["source"] == "generalist" and q1["status"] == "ok" and q1["preview"] == [[35]]
    assert q1["why"].startswith("consensus: 2 of 6 candidates (generalist) return this result")
    by_name = {c["name"]: c for c in traces[0]["candidates"]}
    assert set(by_name) == {"specialist#0", "specialist#1", "generalist#0", "generalist#1", "generalist#2",
                            "generalist#3"}
    assert by_name["specialist#0"]["dropped"].startswith("no SQL in the answer")  # random weights: no SQL block
    # rows (a count of 0) with a literal its column never holds: marked in the trace, not re-bound by default
    assert by_name["generalist#1"]["ungrounded"] == ["city: 'paris'"] and by_name["generalist#1"]["status"] == "ok"
    assert not [e for e in by_name["generalist#1"]["events"] if e["step"] == "repair"]
    fixed = [e for e in by_name["generalist#3"]["events"] if e["step"] == "repair"][0]
    assert fixed["operator"] == "llm" and fixed["engine_error"] == "wrong number of arguments to function substr()"
    classes = traces[0]["selection"]["classes"]
    assert [c["row_count"] for c in classes] == [1, 1, 1] and classes[0]["s_rm"] > classes[1]["s_rm"]  # judge agreed

    # q2: every first candidate was filtered, so the question was re-asked with condensed feedback
    assert q2["sql"] == "SELECT count(*) FROM doctors" and q2["status"] == "ok"
    recovered = [c for c in traces[1]["candidates"] if c["origin"] == "recovery"]
    assert recovered and all("unknown table: physicians" in c["events"][1]["feedback"] for c in recovered)
    judged = [r for r in server.requests if "Which candidate" in r["messages"][-1]["content"]]
    assert len(judged) == 6 and all(r["model"] == "gen" for r in server.requests)


def test_infer_errors_are_clear(tmp_path, demo_db_root):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "sirius_train.cli", "infer", "--db-root", str(demo_db_root),
                               "--output", str(tmp_path / "o.jsonl"), *args], capture_output=True, text=True)

    missing = run("--specialist", str(tmp_path / "nope"), "--db-id", "retail", "--question", "q")
    assert missing.returncode == 2 and "never downloaded" in missing.stderr
    no_db = run("--specialist", "http://127.0.0.1:9/v1", "--specialist-model", "m", "--question", "q")
    assert no_db.returncode == 2 and "--question needs --db-id" in no_db.stderr
    unknown = run("--specialist", "http://127.0.0.1:9/v1", "--specialist-model", "m", "--db-id", "atlantis",
                  "--question", "q")
    assert unknown.returncode == 2 and "unknown db_id 'atlantis'" in unknown.stderr
    assert not (tmp_path / "o.jsonl").exists()


def _infer(*args, db_root, output):
    return subprocess.run([sys.executable, "-m", "sirius_train.cli", "infer", "--db-root", str(db_root), "--output",
                           str(output), *map(str, args)], capture_output=True, text=True)


def test_quiet_infer_keeps_the_line_format_and_refuses_a_prompt_past_the_context(tmp_path, demo_db_root,
                                                                                  specialist):
    """The random specialist writes no SQL: every line still has row_count / preview (null) and says so; a
    question longer than its 8192 positions is answered `too_long` before any generation; --quiet prints one line."""
    questions = tmp_path / "q.jsonl"
    long = "How many customers live in " + "Paris and " * 2400 + "Lisbon?"  # 24k characters, one token each
    rows = [{"id": i, "db_id": "retail", "question": f"How many customers ({i})?"} for i in range(6)]
    rows.insert(3, {"id": "long", "db_id": "retail", "question": long})
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "a.jsonl"
    result = _infer("--input", questions, "--specialist", specialist, "--n-specialist", 2, "--max-new-tokens", 4,
                    "--no-recovery", "--workers", 0, "--threads", 1, "--quiet", db_root=demo_db_root, output=out)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]  # the final line and the no-card notice
    assert lines[-1] == f"wrote {out} (7 answers, 1 too long for the model) and {tmp_path / 'a.trace.jsonl'}"
    assert len(lines) <= 2 and not any(line.startswith(("infer:", "lifecycle", "0 ", "long ")) for line in lines)
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["id"] for a in answers] == [r["id"] for r in rows]
    fields = ["id", "sql", "source", "score", "db_id", "question", "decided_by", "why", "status", "row_count",
              "preview"]
    assert all(list(a) == fields for a in answers)
    refused = answers[3]
    assert (refused["status"], refused["sql"], refused["decided_by"]) == ("too_long", None, "too_long")
    assert "the specialist's context 8192: no room for an answer" in refused["why"]
    for a in answers[:3] + answers[4:]:
        assert a["sql"] is None and a["row_count"] is None and a["preview"] is None
        assert a["why"] == "no candidate has SQL: none of the 2 answers held any (format failures)", a["why"]
    traces = [json.loads(line) for line in (tmp_path / "a.trace.jsonl").read_text().splitlines()]
    assert [t["id"] for t in traces] == [r["id"] for r in rows] and traces[3]["candidates"] == []


def test_a_run_folder_as_specialist_names_its_phase_models(tmp_path, demo_db_root):
    run = tmp_path / "runs" / "demo"
    for phase in ("sft", "stage1"):
        (run / phase / "model").mkdir(parents=True)
        (run / phase / "DONE.json").write_text(json.dumps({"phase": phase, "model": str(run / phase / "model")}))
    (run / "config.yaml").write_text("name: demo\n")
    result = _infer("--specialist", run, "--db-id", "retail", "--question", "q", db_root=demo_db_root,
                    output=tmp_path / "o.jsonl")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--specialist {run} is a run folder, not a model; its phase models are sft: {run}/sft/model; " \
           f"stage1: {run}/stage1/model" in " ".join(result.stderr.split())
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    result = _infer("--specialist", folder, "--db-id", "retail", "--question", "q", db_root=demo_db_root,
                    output=tmp_path / "o.jsonl")
    assert result.returncode == 2 and "has no tokenizer" in result.stderr
