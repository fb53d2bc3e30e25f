"""The multi-turn SQL episode of `data_synthesis.interaction` inside verl's agent loop: tool, parser, loop.

verl's stock `tool_agent` loop speaks its own format: hermes `<tool_call>` JSON, the tool schemas rendered
into the system prompt, each tool result a new `tool` chat turn. SIRIUS has ONE episode format for
training, `sirius benchmark` and `sirius infer`: the prompt carries `probe_instructions`, the model writes
`<sql>PROBE</sql>`, the observation follows inline in the same answer, the final answer is a ```sql block.
Three registrations put that format into verl; all happen when verl's `AgentLoopWorker` imports this module
for the tool config's `class_name`, before it builds any loop:

- `SqlProbeTool` (a verl `BaseTool`): one probe on the row's database -- in-process in the read-only
  sandbox on `db_root`, or on the reward servers' `/v1/execute` -- rendered as the observation;
- `SqlProbeParser` (tool parser `sirius_sql`, `rollout.multi_turn.format`): a turn whose first closed
  block is a `<sql>` probe calls the tool (`interaction.parse_turn`);
- `SqlAgentLoop` (agent loop `sirius_sql`, `rollout.agent.default_agent_loop`): verl's `ToolAgentLoop`
  with the probe instructions added to the prompt and no tool block, generation stopped at `</sql>`, and
  the observation appended as plain tokens (`interaction.observation_segment`; mask 0, log-prob 0) instead
  of a chat-template tool turn -- the text a local multi-turn rollout produces. Where a turn ends, how the
  episode ends and what the observation is are the protocol's (`data_synthesis.episode`), as locally.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from data_synthesis.episode import (
    after_turn,
    end_ids,
    first_close,
    observation_fits,
    observation_ids,
    tokens_left,
    turn_over,
)
from data_synthesis.interaction import (
    OBSERVATION_OPEN,
    PROBE_CLOSE,
    ProbeLimits,
    ServerProbes,
    TurnKind,
    parse_turn,
    render_observation,
    run_probe,
    with_probe_instructions,
)
from data_synthesis.vllm_sampler import generation_end_ids
from rewards.databases import resolve_db_path
from rewards.outcome import Outcome, Status
from rewards.sandbox import Sandbox
from sirius_train.verl_backend import translate
from sirius_train.verl_backend.reward_manager import MODEL_TOKENS
from sirius_train.verl_backend.translate import AGENT_LOOP, TOOL_NAME, TOOL_PARSER


class SqlProbeTool(BaseTool):
    """Runs one probe per call on the database of the trajectory's row (`create_kwargs={"db_id": ...}`).

    `config` is the tool YAML's `config` (`translate.tool_config`): `db_root`, the `ProbeLimits` fields,
    `max_new_tokens` (the model's own token budget per episode, which `SqlAgentLoop` enforces), and
    `reward_url` to run probes on reward servers (token from `SIRIUS_REWARD_TOKEN`) with in-process probes
    on `db_root` while they are down, as the reward falls back.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(translate.tool_schema()))
        self.limits = ProbeLimits(max_turns=int(config["max_turns"]), max_rows=int(config["max_rows"]),
                                  max_chars=int(config["max_chars"]), turn_timeout_s=float(config["turn_timeout_s"]))
        self.max_new_tokens = int(config["max_new_tokens"])
        self.db_root, self.reward_url = config.get("db_root"), config.get("reward_url")
        if not (self.db_root or self.reward_url):
            raise ValueError("sirius SQL tool: its config needs db_root (in-process probes) or reward_url")
        self._db_ids: dict[str, str] = {}
        self._server = None  # ServerProbes, made on the first probe

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        db_id = (kwargs.get("create_kwargs") or {}).get("db_id")
        if not db_id:
            raise ValueError("sirius SQL tool: create_kwargs needs the row's db_id")
        instance_id = instance_id or uuid4().hex
        self._db_ids[instance_id] = str(db_id)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """The probe's observation; step reward 0 (the episode is scored on its final answer alone)."""
        text = await asyncio.to_thread(self._probe, self._db_ids[instance_id], parameters.get("query"))
        return ToolResponse(text=text), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        self._db_ids.pop(instance_id, None)

    def _probe(self, db_id: str, query: str | None) -> str:
        """The observation of one probe: on the servers, else (or while they are down) in-process."""
        if self.reward_url:
            if self._server is None:
                self._server = ServerProbes(self.reward_url, self.limits, self._in_process if self.db_root else None)
            return self._server(db_id, query)
        return self._in_process(db_id, query)

    def _in_process(self, db_id: str, query: str | None) -> str:
        # a sandbox per probe (not `interaction.SandboxProbes`' cached ones): the loop's episodes probe concurrently
        # from threads, and a sandbox's connection and deadline belong to one query at a time
        with Sandbox(resolve_db_path(self.db_root, db_id), self.limits.sandbox_limits()) as sandbox:
            return run_probe(sandbox, query, self.limits)


@ToolParser.register(TOOL_PARSER)
class SqlProbeParser(ToolParser):
    """A turn whose first closed block is `<sql>PROBE</sql>` calls the SQL tool with `{"query": PROBE}`;
    a final answer (or nothing) calls nothing, and verl's loop ends the episode."""

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids, skip_special_tokens=True)
        turn = parse_turn(text)
        if turn.kind is not TurnKind.PROBE:
            return text, []
        return text, [FunctionCall(name=TOOL_NAME, arguments=json.dumps({"query": turn.sql}, ensure_ascii=False))]


class _TurnServer:
    """verl's server as `SqlAgentLoop` shows it to `ToolAgentLoop`: each `generate` is one whole model turn of the
    protocol (`SqlAgentLoop._turn`), however many server calls it takes; everything else is the server's."""

    def __init__(self, server, turn):
        self._server, self._turn = server, turn

    def __getattr__(self, name):
        return getattr(self._server, name)

    async def generate(self, **kwargs):
        return await self._turn(self._server, **kwargs)


@register(AGENT_LOOP)
class SqlAgentLoop(ToolAgentLoop):
    """verl's tool loop in the SIRIUS episode format (see the module docstring). The model's own tokens are
    kept to `max_new_tokens` as in a local rollout (verl's response budget also holds the observations);
    turn limits (`max_user_turns` = probes, `max_assistant_turns` = probes + 1), the tool's
    create/execute/release and verl's cut of over-long tool text stay `ToolAgentLoop`'s own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tool_schemas = []  # no tool block in the chat template: the prompt is the single-turn prompt
        tool = self.tools[TOOL_NAME]
        self.limits, self.max_new_tokens = tool.limits, tool.max_new_tokens
        # the model's end tokens: vLLM stops on each EOS id of the model's generation_config.json
        self.ends = end_ids(self.tokenizer.eos_token_id, generation_end_ids(self.config.actor_rollout_ref.model.path))
        self.server_manager = _TurnServer(self.server_manager, self._turn)

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        kwargs["raw_prompt"] = with_probe_instructions([dict(m) for m in kwargs["raw_prompt"]], self.limits)
        if not kwargs.get("tools_kwargs"):  # the row's database: the db_id the reward reads too
            db_id = (kwargs.get("extra_info") or {}).get("db_id")
            kwargs["tools_kwargs"] = {TOOL_NAME: {"create_kwargs": {"db_id": db_id}}}
        output = await super().run(sampling_params, **kwargs)
        # verl scores the episode without its response_mask: overlong shaping reads the model's count from here
        output.extra_fields[MODEL_TOKENS] = sum(output.response_mask)
        return output

    def _cap_text_prompt_length(self, prompt_ids: list[int]) -> list[int]:
        """Refuse a prompt past `rollout.prompt_length` instead of verl's cut from the left (a warning only): verl's
        filter measured the row before `run` added the probe instructions, and a cut loses the system prompt or the
        schema's first tables. The backend checks the curriculum before launch (`backend.require_prompt_room`)."""
        limit = self.rollout_config.prompt_length
        if len(prompt_ids) > limit:
            raise ValueError(f"sirius_sql: a prompt of {len(prompt_ids)} tokens with the probe instructions exceeds "
                             f"verl.max_prompt_length={limit}; verl would cut it from the left. Raise "
                             f"verl.max_prompt_length to {len(prompt_ids)} or more")
        return prompt_ids

    async def _handle_generating_state(self, agent_data, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        left = self._tokens_left(agent_data)
        if left <= 0:  # out of tokens after an observation: truncated
            return AgentState.TERMINATED
        return await super()._handle_generating_state(agent_data, self._turn_params(sampling_params, left),
                                                      ignore_termination)

    def _tokens_left(self, agent_data) -> int:
        """The model's own tokens are kept to `max_new_tokens`, verl's response budget holds the observations too."""
        mask = agent_data.response_mask
        return tokens_left(sum(mask), self.max_new_tokens, len(mask), self.response_length)

    async def _turn(self, server, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        """One model turn on verl's server, over when the protocol says (`episode.turn_over`) and cut where its
        first block closes (`episode.first_close`: nothing the server sampled after a final answer is kept); a
        `</sql>` that closed nothing, before an end token or the budget, is asked to go on."""
        budget, tokens, log_probs = sampling_params["max_tokens"], [], []
        while True:
            output = await server.generate(prompt_ids=prompt_ids + tokens, **kwargs,
                                           sampling_params={**sampling_params, "max_tokens": budget - len(tokens)})
            new, so_far = list(output.token_ids), list(tokens)
            k = first_close(len(new), lambda j: self.tokenizer.decode(so_far + new[:j], skip_special_tokens=True))
            tokens, log_probs = so_far + new[:k], log_probs + list(output.log_probs or [])[:k]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if turn_over(text, stopped=not new or new[k - 1] in self.ends, out_of_tokens=len(tokens) >= budget):
                return output.model_copy(update={"token_ids": tokens, "log_probs": log_probs or None})

    def _turn_params(self, sampling_params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        """One turn's sampling: it stops at the end of a probe, as locally. The parser reads the probe from the
        turn's token ids, so they must hold `</sql>`: vLLM's CPU build 0.27 keeps a stop string's tokens in
        `token_ids` either way and drops it from the text only (tests/test_verl_cpu_multiturn.py), and the
        explicit `include_stop_str_in_output` keeps the text and the tokens one answer on any vLLM."""
        params = {**sampling_params, "stop": [*(sampling_params.get("stop") or []), PROBE_CLOSE],
                  "max_tokens": max_tokens}
        if self.rollout_config.name == "vllm":  # vLLM's SamplingParams key (SGLang's takes no such key)
            params["include_stop_str_in_output"] = True
        return params

    async def _handle_processing_tools_state(self, agent_data) -> AgentState:
        """Run the turn's probe, unless the protocol ends the episode here (`episode.after_turn`: a probe that
        used the last token); its observation joins the context as tokens the loss does not see."""
        turn = parse_turn(self.tokenizer.decode(agent_data.response_ids, skip_special_tokens=True))
        end, _ = after_turn(turn, agent_data.user_turns, self.limits, self._tokens_left(agent_data) <= 0)
        if end is not None:
            return AgentState.TERMINATED
        response, reward, _ = await self._call_tool(agent_data.tool_calls[0], agent_data.tools_kwargs, agent_data)
        if reward is not None:
            agent_data.tool_rewards.append(reward)
        ids = observation_ids(self._as_observation(response.text),
                              lambda text: self.tokenizer.encode(text, add_special_tokens=False), self.limits)
        if not observation_fits(len(agent_data.response_mask), len(ids), self.response_length):
            return AgentState.TERMINATED
        agent_data.prompt_ids = agent_data.prompt_ids + ids
        agent_data.response_mask = agent_data.response_mask + [0] * len(ids)
        if agent_data.response_logprobs:
            agent_data.response_logprobs = agent_data.response_logprobs + [0.0] * len(ids)
        agent_data.user_turns += 1
        return AgentState.GENERATING

    def _as_observation(self, text: str | None) -> str:
        """verl's own messages (a failed tool call, e.g. the servers down with no `db_root`) typed as errors."""
        if text and text.startswith(OBSERVATION_OPEN):
            return text
        return render_observation(Outcome(Status.ERROR, error=text or "the probe returned nothing"), self.limits)
