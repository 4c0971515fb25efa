"""Convert the math subset of Guru (LLM360/guru-RL-92k, train/math__combined_54.4k.parquet) to verl's
RLHF parquet format: data_source, prompt (chat messages), ability, reward_model.ground_truth, extra_info.

    python examples/data_preprocess/prepare_guru_math.py --local_save_dir ~/data/guru_math [--test_size 500]
"""

import argparse
import json
import os

import pandas as pd
from huggingface_hub import hf_hub_download

REPO = "LLM360/guru-RL-92k"
FILE = "train/math__combined_54.4k.parquet"


def _as_dict(value):
    return json.loads(value) if isinstance(value, str) else dict(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_save_dir", default=os.path.expanduser("~/data/guru_math"))
    parser.add_argument("--test_size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    frame = pd.read_parquet(hf_hub_download(REPO, FILE, repo_type="dataset"))
    rows = pd.DataFrame(
        {
            "data_source": frame["data_source"],
            "prompt": [list(p) for p in frame["prompt"]],
            "ability": frame.get("ability", "math"),
            "reward_model": [
                {"style": "rule", "ground_truth": str(_as_dict(r)["ground_truth"])} for r in frame["reward_model"]
            ],
            "extra_info": [{"index": i, "split": "guru_math"} for i in range(len(frame))],
        }
    ).sample(frac=1.0, random_state=args.seed)
    os.makedirs(os.path.expanduser(args.local_save_dir), exist_ok=True)
    test, train = rows.iloc[: args.test_size], rows.iloc[args.test_size :]
    train.to_parquet(os.path.join(os.path.expanduser(args.local_save_dir), "train.parquet"))
    test.to_parquet(os.path.join(os.path.expanduser(args.local_save_dir), "test.parquet"))
    print(f"wrote {len(train)} train / {len(test)} test rows to {args.local_save_dir}")


if __name__ == "__main__":
    main()
