"""pacs as torchmetrics metrics, alone and in a Lightning validation loop."""
import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from pacs.metric import PACScorePlusPlus
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

torch.manual_seed(0)
backbone = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")  # or checkpoint="PAC++_...pth"


class Captioned(Dataset):
    """Four images (uint8 tensors [3, H, W], 0..255 like torchmetrics' CLIPScore), a caption and references each."""

    colours = (("red", (220, 20, 20)), ("green", (20, 200, 40)), ("blue", (20, 40, 220)), ("grey", (128, 128, 128)))

    def __len__(self):
        return len(self.colours)

    def __getitem__(self, index):
        name, rgb = self.colours[index]
        image = torch.tensor(rgb, dtype=torch.uint8).view(3, 1, 1).expand(3, 64, 64).clone()
        return image, f"a {name} square", [f"a {name} image", f"a square in {name}"]


def collate(batch):
    images, captions, references = zip(*batch)
    return torch.stack(images), list(captions), list(references)


# 1. torchmetrics on its own: update per batch, compute the mean
pacs = PACScorePlusPlus(backbone=backbone)
ref_pacs = PACScorePlusPlus(backbone=backbone, reference_based=True, return_per_sample=True)
for images, captions, references in DataLoader(Captioned(), batch_size=2, collate_fn=collate):
    pacs.update(images, captions)
    ref_pacs.update(images, captions, references)
print(f"PAC-S++ {pacs.compute():.4f}")
result = ref_pacs.compute()
print(f"RefPAC-S++ {result['score']:.4f}, per sample {[round(v, 4) for v in result['per_sample'].tolist()]}")


# 2. in Lightning: the metric is a module attribute, updated in validation_step and logged as an object
class Captioner(L.LightningModule):
    """A stand-in captioner whose 'generated' captions are the dataset's; only the validation loop matters here."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.val_pacs = PACScorePlusPlus(backbone=backbone)

    def validation_step(self, batch, batch_idx):
        images, captions, _ = batch
        self.val_pacs.update(images, captions)
        self.log("val/pac-s++", self.val_pacs, on_epoch=True, batch_size=len(captions))


trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
metrics = trainer.validate(Captioner(), DataLoader(Captioned(), batch_size=2, collate_fn=collate), verbose=False)
print(f"Lightning val/pac-s++ {metrics[0]['val/pac-s++']:.4f}")
