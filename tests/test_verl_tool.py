"""The SIRIUS SQL tool inside verl 0.9.1's own tool machinery, on real token ids and real SQLite files.

verl builds the tool from our tool config with its own `initialize_tools_from_config`, picks our parser
from its `ToolParser` registry and runs `create/execute/release` as its `ToolAgentLoop` does. Nothing of
verl is replaced; the databases are the demo SQLite files and a real reward server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import import_verl

import_verl("verl")

from verl.experimental.agent_loop.tool_parser import ToolParser  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from data_synthesis.interaction import OBSERVATION_CLOSE, ProbeLimits, render_observation  # noqa: E402
from rewards.outcome import Outcome, Status  # noqa: E402
from sirius_train.local.model import NANO_CHAT_TEMPLATE, train_tokenizer  # noqa: E402
import sirius_train.verl_backend.sql_tool  # noqa: E402, F401  (registers our parser and agent loop with verl)
from sirius_train.verl_backend.translate import (  # noqa: E402
    TOOL_NAME,
    TOOL_PARSER,
    max_observation_chars,
    tool_config,
)

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LIMITS = ProbeLimits(max_turns=2, max_rows=3, max_chars=200, turn_timeout_s=1.0)


def episode_tokenizer():
    """A tokenizer for probe-and-answer episodes on the demo database, with a chat template."""
    texts = ["SELECT count(*) FROM customers WHERE city = 'Paris'", "<sql>SELECT name FROM products</sql>",
             "```sql\nSELECT 1\n```", "Let me look at the table first."]
    tok = train_tokenizer(texts * 20, 400)
    # as Qwen's templates do, render tool schemas into the prompt when given some (ours must give none)
    tok.chat_template = "{% if tools %}<|system|>tools: {{ tools | tojson }}\n{% endif %}" + NANO_CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    return episode_tokenizer()


def build_tool(tmp_path, db_root, reward_url=None):
    path = tmp_path / "sql_tool.yaml"
    path.write_text(yaml.safe_dump(tool_config(LIMITS, str(db_root), 256, reward_url)))
    (tool,) = initialize_tools_from_config(str(path))  # verl's own loader: imports our class by its class_name
    return tool


def probe(tool, db_id, query):
    async def episode():
        instance, _ = await tool.create(create_kwargs={"db_id": db_id})
        try:
            return await tool.execute(instance, {"query": query})
        finally:
            await tool.release(instance)

    response, reward, _ = asyncio.run(episode())
    assert reward == 0.0
    return response.text


def test_parser_reads_a_probe_from_real_token_ids(tokenizer):
    parser = ToolParser.get_tool_parser(TOOL_PARSER, tokenizer)  # what ToolAgentLoop does with multi_turn.format
    turn = "Let me look at the table first. <sql>SELECT count(*) FROM customers WHERE city = 'Paris'</sql>"
    ids = tokenizer.encode(turn, add_special_tokens=False)
    assert len(ids) > 10
    content, calls = asyncio.run(parser.extract_tool_calls(ids))
    assert content == turn
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (TOOL_NAME, {"query": "SELECT count(*) FROM customers WHERE city = 'Paris'"})]


@pytest.mark.parametrize("turn", [
    "```sql\nSELECT 1\n```",  # the final answer: no call, the loop ends the episode
    "```sql\nSELECT 1\n``` then <sql>SELECT 2</sql>",  # the first closed block decides, as locally
    "<sql>SELECT name FROM products",  # an unclosed probe is no probe
    '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>',  # hermes is not our format
])
def test_parser_calls_nothing_without_a_closed_first_probe(tokenizer, turn):
    parser = ToolParser.get_tool_parser(TOOL_PARSER, tokenizer)
    _, calls = asyncio.run(parser.extract_tool_calls(tokenizer.encode(turn, add_special_tokens=False)))
    assert calls == []


def test_tool_runs_probes_in_the_sandbox_and_types_them(tmp_path, demo_db_root):
    tool = build_tool(tmp_path, demo_db_root)
    assert tool.name == TOOL_NAME and tool.limits == LIMITS
    db = demo_db_root / "retail" / "retail.sqlite"
    paris = sqlite3.connect(db).execute("SELECT count(*) FROM customers WHERE city = 'Paris'").fetchone()[0]
    text = probe(tool, "retail", "SELECT count(*) FROM customers WHERE city = 'Paris'")
    assert text == f"<observation>\nok: 1 row\ncount(*)\n{paris}\n</observation>"
    many = probe(tool, "retail", "SELECT id FROM orders")  # 1500 rows: 3 shown, the true count stated
    assert many.splitlines()[1:6] == ["ok: 1500 rows, first 3 shown", "id", "1", "2", "3"]
    assert probe(tool, "retail", "SELECT nme FROM customers").startswith("<observation>\nerror: no such column: nme")


def test_hostile_probe_is_typed_and_the_database_is_unchanged(tmp_path, demo_db_root):
    tool = build_tool(tmp_path, demo_db_root)
    db = demo_db_root / "retail" / "retail.sqlite"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for query in ("DELETE FROM customers", "DROP TABLE orders", "ATTACH DATABASE '/tmp/x.db' AS x",
                  "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"):
        status = probe(tool, "retail", query).splitlines()[1].split(":")[0]
        assert status in (Status.REJECTED, Status.ERROR, Status.TIMEOUT), query
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_reward_server_probes_read_as_in_process_ones(tmp_path, demo_db_root):
    from server_harness import running_server

    from rewards.service import ServerConfig

    local = build_tool(tmp_path, demo_db_root)
    with running_server(ServerConfig(demo_db_root, workers=1, timeout_s=1.0)) as server:
        remote = build_tool(tmp_path, None, reward_url=server.url)
        for query in ("SELECT id, name FROM customers ORDER BY id", "SELECT count(*) FROM orders",
                      "SELECT nme FROM customers", "DELETE FROM customers"):
            assert probe(remote, "retail", query) == probe(local, "retail", query), query
        assert sum(server.service.stats()["outcomes"].values()) == 4  # every remote probe ran on the server


def test_verl_never_cuts_an_observation(tmp_path):
    """`max_tool_response_length` (verl: 256 by default) covers the longest observation the tool renders."""
    hostile = OBSERVATION_CLOSE * 100  # each neutralised closing tag grows by one character
    for outcome in (Outcome(Status.OK, ((hostile, hostile),) * 50, ("a", "b")), Outcome(Status.ERROR, error=hostile),
                    Outcome(Status.OK, (("x" * 5000,),), ("c",))):
        assert len(render_observation(outcome, LIMITS)) <= max_observation_chars(LIMITS)
    # a body of exactly max_chars (no cut), as many closing tags as fit: 13 grow by one character each
    fits = OBSERVATION_CLOSE * 13 + "x" * (LIMITS.max_chars - len("error: ") - 13 * len(OBSERVATION_CLOSE))
    worst = render_observation(Outcome(Status.ERROR, error=fits), LIMITS)
    assert len(worst) == LIMITS.max_chars + 13 + len("<observation>\n\n</observation>")
    assert len(worst) <= max_observation_chars(LIMITS) <= len(worst) + 1


class ScriptedPolicy:
    """Stands in for verl's vLLM/SGLang server (`LLMServerClient.generate`), which cannot run without a GPU:
    each call answers the next scripted turn as real token ids, and records what the loop sent."""

    def __init__(self, tokenizer, turns: list[str]):
        self.turns = [tokenizer.encode(t, add_special_tokens=False) for t in turns]
        self.calls: list[tuple[list[int], dict]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append((list(prompt_ids), dict(sampling_params)))
        ids = self.turns[len(self.calls) - 1][:sampling_params["max_tokens"]]  # as vLLM honours max_tokens
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


def run_episode(tmp_path, db_root, tokenizer, turns, limits=LIMITS, max_new_tokens=256, question=None, extra=(),
                policy=None, model_dir=None):
    """One rollout of verl's agent-loop machinery with our loop, set up as `sirius train --backend verl` and
    verl's `AgentLoopWorker` set it up: the run config's stage plan, its tool config file, the composed
    trainer config, tools from that file, the loop from verl's registry through `hydra.utils.instantiate`.
    `policy`: the server (a `ScriptedPolicy` of `turns` unless given); `model_dir`: the model folder verl is told
    (its generation_config.json names the model's end tokens)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from sirius_train.verl_backend.compose import compose_verl_config

    plan = multi_turn_plan(tmp_path, db_root, limits, max_new_tokens, extra)
    Path(plan.paths.tool_config).parent.mkdir(parents=True, exist_ok=True)
    Path(plan.paths.tool_config).write_text(yaml.safe_dump(plan.tool_config))
    config = compose_verl_config(plan.overrides, plan.tool_config)
    if model_dir is not None:
        config.actor_rollout_ref.model.path = str(model_dir)
    policy = policy or ScriptedPolicy(tokenizer, turns)
    policy.config = config
    tools = initialize_tools_from_config(config.actor_rollout_ref.rollout.multi_turn.tool_config_path)

    async def episode():
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[config.actor_rollout_ref.rollout.agent.default_agent_loop],
            trainer_config=DictConfigWrap(config=config), server_manager=policy, tokenizer=tokenizer, processor=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), tools=ToolListWrap(tools))
        assert type(loop).__name__ == "SqlAgentLoop"
        messages = [{"role": "user", "content": question or "Question: how many customers live in Paris?"}]
        return await loop.run({"temperature": 1.0, "top_p": 1.0, "logprobs": True}, raw_prompt=messages,
                              extra_info={"db_id": "retail", "index": 0}, tools_kwargs={})

    return asyncio.run(episode()), policy


def multi_turn_plan(tmp_path, db_root, limits=LIMITS, max_new_tokens=256, extra=()):
    from sirius_train.config import load_config
    from sirius_train.verl_backend import plan_run

    cfg = load_config(CONFIGS / "nano.yaml", [
        "backend=verl", f"output_dir={tmp_path}", f"data.db_root={db_root}", f"stages.0.max_new_tokens={max_new_tokens}",
        "rollout.multi_turn.enabled=true", *(f"rollout.multi_turn.{k}={getattr(limits, k)}"
                                             for k in ("max_turns", "max_rows", "max_chars", "turn_timeout_s")),
        *extra])
    return plan_run(cfg)[0]


def test_agent_loop_runs_an_episode_in_our_format(tmp_path, demo_db_root, tokenizer):
    from data_synthesis.interaction import observation_segment, probe_instructions

    db = demo_db_root / "retail" / "retail.sqlite"
    paris = sqlite3.connect(db).execute("SELECT count(*) FROM customers WHERE city = 'Paris'").fetchone()[0]
    probe_turn = "Let me look at the table first. <sql>SELECT count(*) FROM customers WHERE city = 'Paris'</sql>"
    answer_turn = "```sql\nSELECT count(*) FROM customers WHERE city = 'Paris'\n```"
    # the server samples past the closed answer (to its EOS); the turn, as locally, ends where the block closed
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, [probe_turn, answer_turn + tokenizer.eos_token])

    observation = observation_segment(f"<observation>\nok: 1 row\ncount(*)\n{paris}\n</observation>")
    assert tokenizer.decode(out.response_ids) == probe_turn + observation + answer_turn
    probe_ids, obs_ids, answer_ids = (tokenizer.encode(t, add_special_tokens=False)
                                      for t in (probe_turn, observation, answer_turn))
    # the observation is context (mask 0, log-prob 0), the policy's tokens are not
    assert out.response_mask == [1] * len(probe_ids) + [0] * len(obs_ids) + [1] * len(answer_ids)
    assert out.response_logprobs == [-0.5] * len(probe_ids) + [0.0] * len(obs_ids) + [-0.5] * len(answer_ids)
    assert out.num_turns == 4  # verl counts 1 + assistant turns (2) + tool turns (1)
    # every generation stops at the end of a probe, its text and tokens keeping `</sql>` (vLLM's option, set
    # explicitly: the parser reads the probe from them); the prompt is ours: probe instructions, no tool block
    assert all("</sql>" in params["stop"] and params["include_stop_str_in_output"] is True
               for _, params in policy.calls)
    prompt = tokenizer.decode(out.prompt_ids)
    assert probe_instructions(LIMITS) in prompt and "tools:" not in prompt
    # the second generation continues from the prompt, the probe and its observation
    assert policy.calls[1][0] == out.prompt_ids + probe_ids + obs_ids


def test_a_probe_past_max_turns_ends_the_episode_unanswered(tmp_path, demo_db_root, tokenizer):
    one = ProbeLimits(max_turns=1, max_rows=3, max_chars=200, turn_timeout_s=1.0)
    turns = ["<sql>SELECT count(*) FROM orders</sql>", "<sql>SELECT count(*) FROM products</sql>"]
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, turns, limits=one)
    multi_turn = policy.config.actor_rollout_ref.rollout.multi_turn
    assert (multi_turn.max_user_turns, multi_turn.max_assistant_turns) == (1, 2)
    assert len(policy.calls) == 2  # the second probe is generated but never run
    text = tokenizer.decode(out.response_ids)
    assert text.count("<observation>") == 1 and text.endswith(turns[1])
    assert out.num_turns == 2 * 1 + 2  # probes run = num_turns / 2 - 1 (docs/MULTITURN.md: verl's turns_mean)
    from rewards.extract import extract_sql

    assert extract_sql(text) is None  # no final answer: the reward scores a format failure


def test_the_model_keeps_to_max_new_tokens_observations_aside(tmp_path, demo_db_root, tokenizer):
    probe_turn = "Let me look at the table first. <sql>SELECT count(*) FROM customers WHERE city = 'Paris'</sql>"
    answer_turn = "```sql\nSELECT count(*) FROM customers WHERE city = 'Paris'\n```" + tokenizer.eos_token
    probe_ids = tokenizer.encode(probe_turn, add_special_tokens=False)
    budget = len(probe_ids) + 5
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, [probe_turn, answer_turn], max_new_tokens=budget)
    assert [params["max_tokens"] for _, params in policy.calls] == [budget, 5]
    assert sum(out.response_mask) == budget  # the answer was cut at the model's budget: truncated
    assert "<observation>" in tokenizer.decode(out.response_ids)
    # a probe that spends the last token is not run (the local rollout's truncated episode)
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, [probe_turn], max_new_tokens=len(probe_ids))
    assert len(policy.calls) == 1 and "<observation>" not in tokenizer.decode(out.response_ids)
    assert out.num_turns == 2  # no probe ran


def test_a_non_ascii_observation_is_cut_to_its_token_budget_and_the_episode_answers(tmp_path, demo_db_root,
                                                                                      tokenizer):
    """200 characters of CJK text are 600 byte-level tokens: counted as 200, the observation overran the response
    budget and the episode ended unanswered (reward -1)."""
    from data_synthesis.episode import observation_tokens

    one = ProbeLimits(max_turns=1, max_rows=3, max_chars=200, turn_timeout_s=1.0)
    probe_turn = "<sql>SELECT replace(hex(zeroblob(100)), '00', '数据') AS x</sql>"  # 200 characters, 600 tokens
    answer_turn = "```sql\nSELECT 1\n```"
    out, policy = run_episode(tmp_path, demo_db_root, tokenizer, [probe_turn, answer_turn + tokenizer.eos_token],
                              limits=one)
    assert len(policy.calls) == 2  # the answer was asked for after the observation
    text = tokenizer.decode(out.response_ids)
    assert text.endswith(answer_turn) and "... (cut to fit)\n</observation>" in text
    assert out.response_mask.count(0) <= observation_tokens(one)  # the observation's tokens, within what was reserved


def test_a_prompt_too_long_with_the_probe_instructions_is_refused_not_cut(tmp_path, demo_db_root, tokenizer):
    from data_synthesis.interaction import with_probe_instructions
    from data_synthesis.prompts import chat_text

    question = "Question: how many customers live in Paris? " * 8
    plain, full = (len(tokenizer(chat_text(tokenizer, m), add_special_tokens=False)["input_ids"])
                   for m in ([{"role": "user", "content": question}],
                             with_probe_instructions([{"role": "user", "content": question}], LIMITS)))
    assert plain < full  # verl's filter measures the row without the instructions and keeps it at this limit
    with pytest.raises(ValueError, match=rf"a prompt of {full} tokens with the probe instructions exceeds "
                                         rf"verl.max_prompt_length={plain}; verl would cut it from the left"):
        run_episode(tmp_path, demo_db_root, tokenizer, ["```sql\nSELECT 1\n```"], question=question,
                    extra=[f"verl.max_prompt_length={plain}"])


def test_dry_run_composes_the_tool_agent_sized_for_tables(tmp_path, demo_db_root):
    from sirius_train.verl_backend.compose import compose_verl_config

    limits = ProbeLimits(max_turns=3, max_rows=20, max_chars=1500, turn_timeout_s=2.0)
    plan = multi_turn_plan(tmp_path, demo_db_root, limits, max_new_tokens=96)
    v = compose_verl_config(plan.overrides, plan.tool_config)
    multi_turn, agent = v.actor_rollout_ref.rollout.multi_turn, v.actor_rollout_ref.rollout.agent
    assert multi_turn.enable and multi_turn.format == "sirius_sql" and agent.default_agent_loop == "sirius_sql"
    assert multi_turn.max_tool_response_length == max_observation_chars(limits) > 1500  # verl's default is 256
    assert (multi_turn.max_user_turns, multi_turn.max_assistant_turns) == (3, 4)
    assert multi_turn.tool_config_path == plan.paths.tool_config and v.data.tool_config_path is None
    response = 96 + 3 * (max_observation_chars(limits) + 2)
    # verl's response room holds the observations; the overlong buffer counts the model's own 96 tokens, as locally
    assert v.data.max_response_length == response and v.reward.reward_kwargs.max_resp_len == 96
    (tool,) = plan.tool_config["tools"]
    assert tool["config"]["max_new_tokens"] == 96 and tool["config"]["db_root"] == str(demo_db_root.resolve())
    assert "reward_url" not in tool["config"]
    served = multi_turn_plan(tmp_path, demo_db_root, extra=["reward.url=http://10.0.0.1:8000"])
    assert served.tool_config["tools"][0]["config"]["reward_url"] == "http://10.0.0.1:8000"


@pytest.mark.parametrize("break_it, message", [
    (lambda t: t["tools"][0].update(class_name="sirius_train.verl_backend.sql_tool.NoSuchTool"), "NoSuchTool"),
    (lambda t: t["tools"][0]["config"].update(max_chars=10), "max_chars >= 40"),
    (lambda t: t["tools"][0]["config"].update(type="mcp"), "'mcp' is not a valid ToolType"),
    (lambda t: t["tools"][0]["tool_schema"]["function"].pop("description"), "description"),
])
def test_dry_run_refuses_a_tool_config_verl_could_not_load(tmp_path, demo_db_root, break_it, message):
    from sirius_train.config import ConfigError
    from sirius_train.verl_backend.compose import compose_verl_config

    plan = multi_turn_plan(tmp_path, demo_db_root)
    break_it(plan.tool_config)
    with pytest.raises(ConfigError, match="verl cannot load the multi-turn tool config") as error:
        compose_verl_config(plan.overrides, plan.tool_config)
    assert message in str(error.value)


def test_cli_dry_run_prints_the_tool_config_and_writes_nothing(tmp_path, demo_db_root):
    from typer.testing import CliRunner

    from sirius_train.cli import app

    result = CliRunner().invoke(app, ["train", str(CONFIGS / "nano.yaml"), "--backend", "verl", "--dry-run",
                                      f"output_dir={tmp_path}", f"data.db_root={demo_db_root}",
                                      # nano_multiturn's observation budget: nano's 1024 positions hold 3 observations of 400
                                      "rollout.multi_turn.enabled=true", "rollout.multi_turn.max_turns=2",
                                      "rollout.multi_turn.max_chars=160"])
    assert result.exit_code == 0, result.output
    assert result.output.count("-- tool config (") == 2  # one per stage
    assert "class_name: sirius_train.verl_backend.sql_tool.SqlProbeTool" in result.output
    assert "default_agent_loop: sirius_sql" in result.output and "format: sirius_sql" in result.output
    assert list(tmp_path.iterdir()) == []
