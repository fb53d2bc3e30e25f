"""Samplers: `n` answers per chat prompt from some policy. The one interface pass-rate estimation,
candidate generation and evaluation use, whatever serves the model.

- `HFSampler`: a Hugging Face causal LM in this process (a local path, or a live model object --
  the trainer passes its current policy to re-estimate difficulty), through `generation.generate`
  (batched, one prefill per prompt), the loop the local trainer's rollouts use, on CPU or GPU.
- `OpenAISampler`: any OpenAI-compatible server (vLLM's on a cluster), through `ChatClient`.
- `EpisodeSampler`: an `HFSampler`'s model answering in multi-turn episodes (`data_synthesis.multiturn`):
  it may probe its prompt's database before the final answer, so `sample` also takes `db_ids`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from data_synthesis.chat_client import ChatClient
from data_synthesis.model_card import card_format


@runtime_checkable
class Sampler(Protocol):
    def sample(self, prompts: list[list[dict]], n: int, *, temperature: float = 1.0, top_p: float = 1.0,
               max_new_tokens: int = 256, seed: int | None = None) -> list[list[str]]:
        """For each chat prompt, `n` completion texts (in a stable order)."""
        ...


@dataclass(frozen=True)
class TokenUsage:
    """Tokens one prompt's request of n answers used, as the engine counted them: users size `max_new_tokens`
    and budgets from these. Every sampler here sets `last_usage` (one per prompt of its last `sample` call)."""

    prompt: int = 0  # prompt tokens (once per request: its n answers share them)
    answer: int = 0  # tokens of the answers (the policy's own tokens in an episode)
    answers: int = 0
    at_limit: int = 0  # answers stopped by max_new_tokens, not by their end

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(*(a + b for a, b in zip(astuple(self), astuple(other))))


def rollout_usage(rollout, n: int) -> list[TokenUsage]:
    """Per prompt of a rollout of n answers per prompt (rows grouped by prompt)."""
    prompt, own, cut = rollout.prompt_mask.sum(dim=1), rollout.lengths, rollout.truncated
    return [TokenUsage(int(prompt[i]), int(own[i:i + n].sum()), n, int(cut[i:i + n].sum()))
            for i in range(0, len(rollout.texts), n)]


def request_seed(seed: int | None, i: int, n: int) -> int | None:
    """The seed of prompt i's request for n answers, for engines that seed answer j with `request + j` (vLLM's
    parallel sampling; an OpenAI-compatible vLLM server). Prompt i's own seed stays `seed + i` (a pool's chunk
    starts at `seed + first index`, so a prompt's answers do not depend on its chunk); scaling it by n keeps the
    answers of distinct prompts on distinct streams: `seed + i*n` would give chunk c+1's first prompt the streams
    of chunk c's second.

    >>> [request_seed(3, i, 4) for i in range(3)], request_seed(None, 1, 4)
    ([12, 16, 20], None)
    """
    return None if seed is None else (seed + i) * n


class HFSampler:
    """Batched sampling from a local Hugging Face causal LM.

    Args:
        model: a local model folder or .gguf file (`data_synthesis.checkpoints`), or a loaded `PreTrainedModel`.
        tokenizer: its tokenizer (loaded from `model` when that is a path and this is None).
        batch_size: sequences generated together (whole groups of a prompt's samples).

    `prompt_format` is the format of the folder's `sirius.json` (None for a loaded model or a folder without
    one); `difficulty.estimate` asks the model that way unless told otherwise. `compute_dtype`: the dtype its
    forward passes autocast to (a trainer's float32 master weights sampled in bf16, as its rollouts are).
    """

    prompt_format = None

    def __init__(self, model, tokenizer=None, *, batch_size: int = 16, device: str | None = None,
                 compute_dtype=None):
        import torch

        from data_synthesis.checkpoints import load_model, locate

        if isinstance(model, (str, Path)):
            folder, gguf = locate(model)
            self.prompt_format = card_format(folder) if gguf is None else None
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
            model, loaded_tokenizer = load_model(folder, device=device, dtype=dtype, gguf_file=gguf)
            tokenizer = tokenizer or loaded_tokenizer
        if tokenizer is None:
            raise ValueError("a tokenizer is required when passing a loaded model")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.compute_dtype = compute_dtype
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    def autocast(self):
        """The context of this sampler's forward passes: autocast to `compute_dtype` when it differs from the weights'."""
        import torch

        device = next(self.model.parameters()).device
        enabled = self.compute_dtype is not None and self.compute_dtype != next(self.model.parameters()).dtype
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype, enabled=enabled)

    def sample(self, prompts, n, *, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None):
        """The trainer's rollout loop: a prompt's answers share one prefill, and stop at the end of SQL."""
        import torch

        from data_synthesis.generation import generate

        if seed is not None:
            torch.manual_seed(seed)
        with self.autocast():
            rollout = generate(self.model, self.tokenizer, prompts, n=n, temperature=temperature, top_p=top_p,
                               max_new_tokens=max_new_tokens, batch_size=self.batch_size)
        self.last_usage = rollout_usage(rollout, n)
        return [rollout.texts[i * n:(i + 1) * n] for i in range(len(prompts))]

    @property
    def max_model_len(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", None) or 1 << 30

    def continue_ids(self, contexts, *, max_tokens, seeds, temperature=1.0, top_p=1.0, stop=()):
        """The model as a `turns.TokenEngine`: each context continued on its own, through the first `stop` string,
        EOS or `max_tokens` (each request seeded, so its tokens depend on nothing else in the call)."""
        import torch

        from data_synthesis.generation import policy_sampling

        device = next(self.model.parameters()).device
        out = []
        with torch.no_grad(), policy_sampling(self.model), self.autocast():
            for ids, budget, seed in zip(contexts, max_tokens, seeds):
                if budget <= 0:
                    out.append([])
                    continue
                if seed is not None:
                    torch.manual_seed(seed)
                x = torch.tensor([ids], device=device)
                sequence = self.model.generate(
                    input_ids=x, attention_mask=torch.ones_like(x), do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None, top_p=top_p if temperature > 0 else None,
                    top_k=None, max_new_tokens=budget, pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=self.tokenizer.eos_token_id, stop_strings=list(stop) or None,
                    tokenizer=self.tokenizer)
                out.append(sequence[0, len(ids):].tolist())
        return out


class EpisodeSampler:
    """`n` multi-turn episodes per prompt: the model may run `<sql>` probes on the prompt's database under
    `db_root` (read-only sandbox, `limits`' per-turn deadline) before its final answer, the episode format of
    training. Each text is the whole episode (probes, observations, answer); `rewards.extract.extract_sql`
    reads its final answer."""

    multi_turn = True  # `sample` takes the prompts' `db_ids`

    def __init__(self, sampler: HFSampler, limits, db_root: str | Path):
        if not isinstance(sampler, HFSampler):
            raise ValueError("multi-turn episodes need a local HF model (engine hf): an OpenAI-compatible server or "
                             "vLLM cannot run probes between turns yet")
        self.sampler, self.limits, self.db_root = sampler, limits, db_root
        self.prompt_format = sampler.prompt_format

    def sample(self, prompts, n, *, db_ids, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None):
        import torch

        from data_synthesis.interaction import SandboxProbes
        from data_synthesis.multiturn import generate_episodes

        if len(db_ids) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(db_ids)} db_ids")
        if seed is not None:
            torch.manual_seed(seed)
        with SandboxProbes(self.db_root, self.limits) as probes, self.sampler.autocast():
            rollout = generate_episodes(self.sampler.model, self.sampler.tokenizer, prompts,
                                        lambda i, sql: probes(db_ids[i], sql), self.limits, n=n,
                                        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                        batch_size=self.sampler.batch_size)
        self.last_usage = rollout_usage(rollout, n)
        return [rollout.texts[i * n:(i + 1) * n] for i in range(len(prompts))]


class OpenAISampler:
    """Sampling through an OpenAI-compatible server; prompts are sent concurrently."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, concurrency: int = 8,
                 timeout_s: float = 300.0):
        self.client = ChatClient(base_url, model, api_key=api_key, timeout_s=timeout_s)
        self.concurrency = concurrency

    def sample(self, prompts, n, *, temperature=1.0, top_p=1.0, max_new_tokens=256, seed=None):
        def one(i: int) -> tuple[list[str], dict]:
            return self.client.complete_with_usage(prompts[i], n=n, temperature=temperature, top_p=top_p,
                                                   max_tokens=max_new_tokens, seed=request_seed(seed, i, n))

        with ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(one, range(len(prompts))))
        self.last_usage = [TokenUsage(u["prompt"], u["answer"], len(texts), u["at_limit"]) for texts, u in answers]
        return [texts for texts, _ in answers]
