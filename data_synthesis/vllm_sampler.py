"""`VLLMSampler`: offline batched generation with `vllm.LLM`, for pass-rate estimation and inference on GPUs.

One engine per process (one GPU, or `tensor_parallel_size` GPUs for a 32B model); `data_synthesis.ray_sampler`
runs one per GPU of a cluster. Prompts are rendered with the model's chat template exactly as `HFSampler`
renders them (`chat_text`, no extra special tokens) and handed to vLLM as token ids, so both samplers answer
the same prompt. Prompt i's request is seeded `samplers.request_seed(seed, i, n)` (as `OpenAISampler` sends it):
vLLM seeds per request, so an answer does not depend on which other prompts share its batch, and it seeds answer j
of a request with `request + j`, which the scaling by n keeps off every other prompt's streams.

vLLM is an optional extra (`pip install 'sirius-sql[vllm]'`, CUDA machines only); it is imported when a
sampler is built, and its absence is a `MissingExtra` error (`data_synthesis.extras`) that names the extra.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from data_synthesis.extras import require
from data_synthesis.model_card import card_format
from data_synthesis.prompts import chat_text
from data_synthesis.samplers import TokenUsage, request_seed


def import_vllm():
    """The `vllm` module, or `MissingExtra` naming `pip install 'sirius-sql[vllm]'`."""
    return require("vllm", "vllm", "the vLLM sampler",
                   "sample with the HF sampler, or an OpenAI-compatible server with --url")


class VLLMSampler:
    """Sampling from a local model folder with a `vllm.LLM` engine in this process.

    Args:
        model: a local Hugging Face model folder (never downloaded at run time).
        tensor_parallel_size: GPUs one engine spans (1 for <= 14B in bf16 on 80 GB; 2-4 for 32B).
        gpu_memory_utilization: share of each GPU's memory vLLM may take (weights + KV cache).
        max_model_len: prompt + answer tokens (None: the model's own limit).
        engine_options: any other `vllm.LLM` keyword (dtype, enforce_eager, distributed_executor_backend, ...).
    """

    def __init__(self, model: str | Path, *, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, **engine_options):
        vllm = import_vllm()
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"model path not found: {path} (models are never downloaded at run time)")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: need >= 1 GPU per engine")
        self._vllm = vllm
        self.prompt_format = card_format(path)  # the folder's sirius.json, as HFSampler reads it
        self.llm = vllm.LLM(model=str(path), tensor_parallel_size=tensor_parallel_size,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            **engine_options)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.end_token_ids = generation_end_ids(path)  # vLLM stops on each of them, not only the tokenizer's eos

    def sample(self, prompts, n, *, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None):
        """n answers per prompt. A prompt longer than the engine's context (`max_model_len`) gets n empty answers
        (no SQL: a format failure when scored), said once on stderr: vLLM would refuse the whole call for it."""
        ids = [self.tokenizer(chat_text(self.tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
        fits = [i for i, prompt in enumerate(ids) if len(prompt) <= self.max_model_len]
        if len(fits) < len(ids):
            print(f"warning: {len(ids) - len(fits)} of {len(ids)} prompts are longer than the vLLM engine's "
                  f"{self.max_model_len} tokens: answered with nothing", file=sys.stderr)
        params = [self._vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                            max_tokens=max_new_tokens, seed=request_seed(seed, i, n))
                  for i in fits]
        outputs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in fits], params, use_tqdm=False)
        answers = [[""] * n for _ in prompts]
        self.last_usage = [TokenUsage(answers=n) for _ in prompts]
        for i, out in zip(fits, outputs):
            choices = sorted(out.outputs, key=lambda c: c.index)
            answers[i] = [c.text for c in choices]
            self.last_usage[i] = TokenUsage(len(ids[i]), sum(len(c.token_ids) for c in choices), n,
                                            sum(c.finish_reason == "length" for c in choices))
        return answers

    def continue_ids(self, contexts, *, max_tokens, seeds, temperature=1.0, top_p=1.0, stop=()):
        """The engine as a `turns.TokenEngine`: each context continued through the first `stop` string (its tokens
        kept in the ids: `include_stop_str_in_output`), EOS or `max_tokens`; one seeded request per context."""
        asked = [i for i, budget in enumerate(max_tokens) if budget > 0]
        params = [self._vllm.SamplingParams(n=1, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                            max_tokens=max_tokens[i], seed=seeds[i], stop=list(stop),
                                            include_stop_str_in_output=True) for i in asked]
        outputs = self.llm.generate([{"prompt_token_ids": contexts[i]} for i in asked], params, use_tqdm=False)
        new = [[] for _ in contexts]
        for i, out in zip(asked, outputs):
            new[i] = list(out.outputs[0].token_ids)
        return new


def generation_end_ids(model: Path) -> frozenset[int]:
    """The EOS ids of a model folder's `generation_config.json` (an int or a list; none without the file)."""
    try:
        eos = json.loads((Path(model) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
