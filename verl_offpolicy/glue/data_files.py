"""The training and validation files, read before Ray starts: what verl's ``RLHFDataset`` and reward loop will need.

verl reads ``data.train_files``/``data.val_files`` in its TaskRunner, after Ray started, and an empty file fails
there with a ``datasets`` traceback naming neither the file nor "empty", a missing prompt column as
``KeyError: 'prompt'``, and a prompt that is not UTF-8 text much later. :func:`data_file_problems` checks each file
that exists on this machine (a path that does not exist yet, e.g. one a script writes before the run or one on
the cluster's storage, is left to verl): its format (verl reads ``.parquet``, ``.json``, ``.jsonl``), that it
reads and has rows, the columns the task needs (``data.prompt_key``; ``data_source`` and ``reward_model`` for
verl's registered rule-based reward managers, which read ``reward_model.ground_truth`` of every row), and that
every prompt is text. Each problem names the key, the file and, for a value, the row and the column.
"""

from __future__ import annotations

import json
import os
from typing import Any

from omegaconf import OmegaConf

from verl_offpolicy.glue.knobs import OffPolicyConfigError

DATA_KEYS = ("data.train_files", "data.val_files")
FORMATS = (".parquet", ".json", ".jsonl")  # verl/utils/dataset/rl_dataset.py: RLHFDataset._read_files_and_tokenize
REWARD_COLUMNS = ("data_source", "reward_model")


def _files(cfg: Any, key: str) -> list[str]:
    files = OmegaConf.select(cfg, key, default=None)
    if files is None:
        return []
    if OmegaConf.is_config(files):
        files = OmegaConf.to_container(files, resolve=True)
    return [str(f) for f in (files if isinstance(files, list | tuple) else [files])]


def _needs_reward_columns(cfg: Any) -> bool:
    """verl's registered reward managers read ``data_source`` and ``reward_model.ground_truth`` of every row."""
    if OmegaConf.select(cfg, "reward.reward_model.enable", default=False):
        return False
    manager = OmegaConf.select(cfg, "reward.reward_manager", default=None) or {}
    return manager.get("source", "register") == "register"


def _read(path: str, prompt_key: str):
    """``(rows, columns, data)``: a parquet file's row count and column names from its footer and, as a pyarrow
    table, only its prompt column (a training set's other columns are not read); a json/jsonl file's rows as
    dicts."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        columns = list(parquet.schema_arrow.names)
        read = [prompt_key] if prompt_key in columns else []
        return parquet.metadata.num_rows, columns, parquet.read(columns=read)
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            rows = [json.loads(line) for line in f if line.strip()]
        else:
            rows = json.load(f)
            rows = rows if isinstance(rows, list) else [rows]
    return len(rows), sorted({c for row in rows if isinstance(row, dict) for c in row}), rows


def _not_text(value: Any) -> str | None:
    """Why ``value`` (a prompt: a string, or messages of strings) is not text, or None."""
    if isinstance(value, bytes | bytearray):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"bytes that are not UTF-8 ({exc.reason} at byte {exc.start})"
        return "bytes, not text"
    if isinstance(value, dict):
        return next((why for why in map(_not_text, value.values()) if why), None)
    if isinstance(value, list | tuple):
        return next((why for why in map(_not_text, value) if why), None)
    return None


def _holds_bytes(arrow_type) -> bool:
    """Whether values of ``arrow_type`` (a prompt column's type, nested or not) can hold bytes."""
    import pyarrow as pa

    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        return any(_holds_bytes(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _holds_bytes(arrow_type.value_type)
    return False


def _column_values(table, column: str) -> tuple[list[Any], int | None, str | None]:
    """A parquet column's values to check one by one (none when the column is valid UTF-8 text throughout, which
    Arrow checks in one pass); or, when one does not decode (a string that is not UTF-8), the row and why."""
    values = table.column(column)
    if not _holds_bytes(values.type):
        try:
            values.validate(full=True)  # every string of every chunk, nested ones too, is UTF-8
            return [], None, None
        except Exception:  # noqa: BLE001 - pyarrow's ArrowInvalid: find the row below
            pass
    try:
        return values.to_pylist(), None, None
    except UnicodeDecodeError:
        for row in range(len(values)):
            try:
                values[row].as_py()
            except UnicodeDecodeError as exc:
                return [], row, f"text that is not UTF-8 ({exc.reason} at byte {exc.start})"
    return [], None, None


def file_problems(key: str, path: str, prompt_key: str, reward_columns: bool) -> list[str]:
    """The problems of one data file that exists here (see the module docstring)."""
    where = f"{key}: {path}"
    if not path.endswith(FORMATS):
        return [f"{where} is not a file verl reads (allowed formats: {', '.join(FORMATS)})"]
    try:
        rows, columns, data = _read(os.path.expanduser(path), prompt_key)
    except Exception as exc:  # noqa: BLE001 - any failure to read is the answer, named
        return [f"{where} cannot be read ({type(exc).__name__}: {exc})"]
    is_table = not isinstance(data, list)
    if rows == 0:
        return [f"{where} is empty (0 rows): verl would fail after Ray started"]
    needed = [prompt_key, *(REWARD_COLUMNS if reward_columns else ())]
    missing = [c for c in needed if c not in columns]
    if missing:
        fix = (
            f"set data.prompt_key to the prompt's column or write a {prompt_key!r} column"
            if prompt_key in missing
            else ("the reward reads data_source and reward_model.ground_truth of every row")
        )
        return [
            f"{where} has no {'columns' if len(missing) > 1 else 'column'} {', '.join(map(repr, missing))} (its "
            "columns: "
            f"{', '.join(columns)}); {fix}"
        ]
    if is_table:
        prompts, bad_row, why = _column_values(data, prompt_key)
        if bad_row is not None:
            return [f"{where}, row {bad_row}, column {prompt_key!r}: the prompt is {why}"]
    else:
        prompts = [row.get(prompt_key) if isinstance(row, dict) else None for row in data]
    for row, prompt in enumerate(prompts):
        why = _not_text(prompt)
        if why:
            return [f"{where}, row {row}, column {prompt_key!r}: the prompt is {why}"]
    return []


def data_file_problems(cfg: Any) -> list[str]:
    """The problems of every training and validation file of ``cfg`` that exists on this machine."""
    prompt_key = OmegaConf.select(cfg, "data.prompt_key", default="prompt") or "prompt"
    reward_columns = _needs_reward_columns(cfg)
    problems = []
    for key in DATA_KEYS:
        for path in _files(cfg, key):
            local = os.path.expanduser(path)
            if os.path.isfile(local):
                problems += file_problems(key, path, prompt_key, reward_columns)
    return problems


def check_data_files(view) -> None:
    """Every training and validation file on this machine is one verl can train on (:func:`data_file_problems`);
    on every config, the CPU path's and a GPU cluster's: a file that is not here is left to verl."""
    problems = data_file_problems(view.cfg)
    if problems:
        raise OffPolicyConfigError("; ".join(problems))


RULES = (check_data_files,)
