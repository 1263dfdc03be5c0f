"""Lightning: a ``pickleshard.Loader`` returned by ``train_dataloader`` fits
(``Trainer(accelerator="cpu")``), Lightning setting the sampler's epoch through ``loader.sampler``."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from pickleshard import Loader, PickleDataset
from pickleshard.samplers import ShuffleSampler
from pickleshard.testing.resume import write_id_files

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning",  # Lightning's advice on num_workers and logging, irrelevant here
    "ignore::DeprecationWarning",
    "ignore:.*LeafSpec.*is deprecated",
)


class LoaderModule(L.LightningModule):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.net = torch.nn.Linear(2, 1)
        self.seen: list[list[int]] = []

    def train_dataloader(self) -> Loader:
        ds = PickleDataset(self.root)
        return Loader(ds, 8, sampler=ShuffleSampler(ds, seed=0), prefetch=3)

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        self.seen[-1] += y.tolist()
        return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y.float() / 100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.slow
def test_trainer_fits_two_epochs_from_a_loader(tmp_path: Path) -> None:
    n = write_id_files(tmp_path / "data", [13, 20, 7])
    model = LoaderModule(tmp_path / "data")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert trainer.state.finished
    sampler = ShuffleSampler(range(n), seed=0)
    for epoch, seen in enumerate(model.seen):
        sampler.set_epoch(epoch)
        assert seen == list(sampler), f"epoch {epoch} in the sampler's order"
    assert model.seen[0] != model.seen[1], "Lightning set the sampler's epoch"
