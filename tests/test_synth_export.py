"""Stage outputs: verl-layout parquet that verl's own RLHFDataset loads, the report and the histogram."""

import json

import pyarrow.parquet as pq
import pytest
from conftest import import_verl

from data_synthesis.curriculum import build_curriculum
from data_synthesis.difficulty import prompt_for
from data_synthesis.export import write_stage, write_verl_parquet
from data_synthesis.sqlgen.synthesize import synthesize
from rewards.verl_reward import compute_score

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _tokenizer():
    """A real fast tokenizer built locally (character-level WordLevel) with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", "<unk>"] + [chr(i) for i in range(32, 127)] + ["\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def examples(demo_db_root):
    return (synthesize(demo_db_root / "clinic" / "clinic.sqlite", 6, seed=1)
            + synthesize(demo_db_root / "library" / "library.sqlite", 6, seed=1))


def test_parquet_rows_follow_verls_layout(examples, demo_db_root, tmp_path):
    rates = {e.id: 0.25 for e in examples[:3]}
    path = write_verl_parquet(examples, tmp_path / "s.parquet", demo_db_root, pass_rates=rates, compare="spider")
    rows = pq.read_table(path).to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(examples)))
    first = rows[0]
    assert first["data_source"] == "sirius-sql" and first["ability"] == "sql"
    assert first["prompt"] == prompt_for(examples[0], demo_db_root)
    assert first["reward_model"] == {"style": "rule", "ground_truth": examples[0].gold_sql}
    assert first["extra_info"]["db_id"] == "clinic" and first["extra_info"]["difficulty"] == 0.25
    assert first["extra_info"]["question"] == examples[0].question and first["extra_info"]["compare"] == "spider"
    assert rows[5]["extra_info"]["difficulty"] is None  # not estimated


@pytest.mark.verl
def test_parquet_loads_in_verls_rlhf_dataset(examples, demo_db_root, tmp_path, monkeypatch):
    rl_dataset = import_verl("verl.utils.dataset.rl_dataset")
    import datasets
    from omegaconf import OmegaConf

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    path = write_verl_parquet(examples, tmp_path / "stage.parquet", demo_db_root,
                              pass_rates={e.id: 0.5 for e in examples})
    tokenizer = _tokenizer()
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "truncation": "error",
                               "cache_dir": str(tmp_path / "verl")})
    dataset = rl_dataset.RLHFDataset(str(path), tokenizer, config)
    assert len(dataset) == len(examples)
    batch = rl_dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    assert list(batch["index"]) == list(range(len(examples)))
    row = dataset[3]
    assert row["raw_prompt"] == prompt_for(examples[3], demo_db_root)
    assert row["extra_info"]["db_id"] == examples[3].db_id
    text = tokenizer.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=False)
    length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert 200 < length <= 4096  # the real tokenizer saw the real prompt
    # verl's reward call on this row: the gold SQL scores 1, a wrong query 0, no SQL -1
    gold = row["reward_model"]["ground_truth"]
    score = [compute_score(row["data_source"], answer, gold, row["extra_info"], db_root=str(demo_db_root))["score"]
             for answer in (f"```sql\n{gold}\n```", "```sql\nSELECT 42\n```", "no idea")]
    assert score == [1.0, 0.0, -1.0]

    short = OmegaConf.merge(config, {"max_prompt_length": 50})  # verl's own length filter applies to our rows
    assert len(rl_dataset.RLHFDataset(str(path), tokenizer, short)) == 0


def test_stage_files(examples, demo_db_root, tmp_path):
    rates = {e.id: p for e, p in zip(examples, [0.125, 0.375, 0.625, 0.875, 1.0, 0.0] * 2)}
    curriculum = build_curriculum(examples, rates, 16, seed=2)
    paths = write_stage(curriculum, tmp_path / "cur", "stage1", demo_db_root)
    assert {p.name for p in (tmp_path / "cur").iterdir()} == {
        "stage1.parquet", "stage1.report.json", "stage1.histogram.png", "stage1.jsonl", "stage1.new_examples.jsonl"}
    report = json.loads(paths["report"].read_text())
    assert report["selected"] == 16 and [b["selected"] for b in report["bins"]] == [4, 4, 4, 4]
    assert report["dropped"] == {"all correct (p = 1)": 2, "all wrong (p = 0)": 2}
    assert paths["histogram"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pq.read_table(paths["parquet"]).num_rows == 16
    lines = [json.loads(line) for line in paths["examples"].read_text().splitlines()]
    assert all(0 < line["meta"]["pass_rate"] < 1 for line in lines)
