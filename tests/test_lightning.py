"""Lightning: ``Trainer(accelerator="cpu", max_epochs=1)`` fits through a LightningDataModule.

The module below is the Lightning example of docs/usage.md, plus a record of the ids
(the data's ``y``) each training step saw.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from pickleshard import PickleDataset
from pickleshard.samplers import ShuffleSampler
from pickleshard.testing.resume import write_id_files

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning",  # Lightning's advice on num_workers and logging, irrelevant here
    "ignore::DeprecationWarning",
    "ignore:.*LeafSpec.*is deprecated",
)


class PickleDataModule(L.LightningDataModule):
    def __init__(self, root: str | Path, batch_size: int = 8) -> None:
        super().__init__()
        self.root, self.batch_size = root, batch_size

    def setup(self, stage: str) -> None:
        self.train_set = PickleDataset(self.root)

    def train_dataloader(self) -> DataLoader:
        # Lightning calls sampler.set_epoch(epoch) itself before each epoch.
        sampler = ShuffleSampler(self.train_set, seed=0)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler)


class TinyRegressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.seen: list[int] = []

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        self.seen += y.tolist()
        return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y.float() / 100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.slow
def test_trainer_fits_one_epoch_over_every_sample_once(tmp_path: Path) -> None:
    n = write_id_files(tmp_path / "data", [13, 20, 7])
    data, model = PickleDataModule(tmp_path / "data"), TinyRegressor()
    before = model.net.weight.detach().clone()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)

    assert trainer.state.finished
    assert sorted(model.seen) == list(range(n)), "each sample exactly once"
    sampler = ShuffleSampler(data.train_set, seed=0)
    sampler.set_epoch(0)
    assert model.seen == list(sampler), "in the sampler's epoch-0 order"
    assert not torch.equal(model.net.weight, before), "the model trained"
