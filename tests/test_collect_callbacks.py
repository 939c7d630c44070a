"""The Hugging Face and Lightning callbacks profile exactly the configured global steps.

Real libraries, real (tiny) training on the CPU, nothing downloaded: the Bert model is built
from a config, the data is synthetic.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from perfsight.collect.callbacks import StepRangeHooks
from perfsight.collect.options import OptionError

torch = pytest.importorskip("torch")


def profiled_steps(run_folder: Path) -> list[int]:
    """Step numbers of the ``ProfilerStep#N`` ranges in the folder's raw Kineto trace."""
    (trace,) = run_folder.glob("kineto_trace_*.json")
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def test_hugging_face_trainer_callback_profiles_the_configured_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from perfsight.collect.callbacks import PerfsightCallback

    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(0)
    data = [
        {
            "input_ids": torch.randint(0, 100, (16,), generator=generator),
            "attention_mask": torch.ones(16, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }
        for i in range(48)
    ]
    callback = PerfsightCallback(start_step=2, stop_step=4, output_path=tmp_path / "traces")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=6, per_device_train_batch_size=4, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 6
    (folder,) = (tmp_path / "traces").iterdir()
    assert callback.folders == [folder]
    assert profiled_steps(folder) == [2, 3, 4]
    info = json.loads((folder / "profiler_info_0.json").read_text())
    assert info["complete"] is True and info["window"]["steps"] == [2, 3, 4]


def test_lightning_callback_counts_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    from perfsight.collect.callbacks import PerfsightLightningCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1))
    callback = PerfsightLightningCallback(
        start_step=3, stop_step=5, output_path=tmp_path / "traces", options={"profile_memory": True}
    )
    trainer = pl.Trainer(
        max_steps=7, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
        callbacks=[callback], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
    assert trainer.global_step == 7
    (folder,) = (tmp_path / "traces").iterdir()
    # two micro-batches per step: the window still covers three optimizer steps, not batches
    assert profiled_steps(folder) == [3, 4, 5]
    info = json.loads((folder / "profiler_info_0.json").read_text())
    assert info["complete"] is True and info["config"]["profile_memory"] is True


def test_a_wrong_range_or_option_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="start_step must be an integer >= 1"):
        StepRangeHooks(start_step=0)
    with pytest.raises(ValueError, match="stop_step 2 is before start_step 3"):
        StepRangeHooks(start_step=3, stop_step=2)
    with pytest.raises(OptionError, match="key 'profiler_level'"):
        StepRangeHooks(start_step=3, options={"profiler_level": "Level4"})
    assert os.fspath(StepRangeHooks(start_step=3).output_path) == "perfsight_data"
