"""The image-classification path (seed 003: ResNeXt on CIFAR-10), written here: no torchvision.

- `ResNeXt`: the CIFAR variant of Xie et al. 2017 ("Aggregated Residual Transformations"): a 3x3
  stem, stages of bottleneck blocks whose 3x3 convolution is grouped (cardinality C, width d per
  group), global average pooling, a linear head. Presets range from a tiny test model to the
  paper's ResNeXt-29 8x64d.
- Data: scikit-learn's `load_digits` (1,797 real 8x8 handwritten digits that ship inside the
  package: the offline built-in), a CIFAR-10 "python version" directory, or an image folder
  (one sub-directory per class). Images are stored once as uint8 arrays; the Dataset converts,
  normalises and augments (random shifts, flips for photos) per sample, which is the work DataLoader
  workers parallelise.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.core.config import IMAGE_TASK
from trainwise.core.errors import ConfigError
from trainwise.training.data.tasks import Batch

__all__ = ["IMAGE_TASK", "ResNeXt", "build_image_model", "load_image_data"]

# name -> (stem channels, stage output channels, blocks per stage, cardinality, width per group)
VISION_PRESETS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = {
    "resnext-tiny": (16, (32, 64), (1, 1), 4, 4),
    "resnext-small": (32, (64, 128, 256), (1, 1, 1), 8, 8),
    "resnext29-8x16d": (64, (256, 512, 1024), (3, 3, 3), 8, 16),
    "resnext29-8x64d": (64, (256, 512, 1024), (3, 3, 3), 8, 64),  # the paper's CIFAR model, 34M params
}


class Block(nn.Module):
    """Bottleneck with a grouped 3x3 convolution: 1x1 (to C*d) -> 3x3 groups=C -> 1x1 (to out)."""

    def __init__(self, cin: int, cout: int, stride: int, cardinality: int, width: int, stage: int):
        super().__init__()
        inner = cardinality * width * 2**stage  # the group width doubles per stage, as in the paper
        self.conv1 = nn.Conv2d(cin, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride, 1, groups=cardinality, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNeXt(nn.Module):
    supports_gradient_checkpointing = True

    def __init__(self, preset: str, in_channels: int, num_classes: int):
        super().__init__()
        stem, outs, blocks, cardinality, width = VISION_PRESETS[preset]
        self.config = SimpleNamespace(model_type="resnext", is_encoder_decoder=False, use_cache=False, preset=preset)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, stem, 3, 1, 1, bias=False), nn.BatchNorm2d(stem), nn.ReLU())
        layers, cin = [], stem
        for stage, (cout, n) in enumerate(zip(outs, blocks, strict=True)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(Block(cin, cout, stride, cardinality, width, stage))
                cin = cout
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(cin, num_classes)
        self._ckpt = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        self._ckpt = True

    def get_input_embeddings(self) -> nn.Module:
        return self.stem

    def forward(self, pixel_values: torch.Tensor) -> SimpleNamespace:
        x = self.stem(pixel_values)
        for block in self.layers:
            if self._ckpt and self.training:
                x = checkpoint(block, x, use_reentrant=False, context_fn=partial(_statistics_kept, block))
            else:
                x = block(x)
        return SimpleNamespace(logits=self.head(x.mean(dim=(2, 3))))


def _statistics_kept(block: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """checkpoint's contexts for a block: none around its forward, and around its recomputation in the backward one
    that puts its BatchNorm running statistics back as they were. A BatchNorm in training mode updates them at every
    forward, so a recomputed block would count each step's batch twice, and evaluation (which normalises with them)
    would differ from the run without checkpointing (seed 003's recipe read 21.9% accuracy against 13.3%, with the
    same training losses)."""
    return contextlib.nullcontext(), _restored(block)


@contextlib.contextmanager
def _restored(block: nn.Module) -> Iterator[None]:
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    buffers = [b for m in norms for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
    saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, before in zip(buffers, saved, strict=True):
                b.copy_(before)


def build_image_model(preset: str, in_channels: int, num_classes: int, seed: int) -> ResNeXt:
    torch.manual_seed(seed)
    return ResNeXt(preset, in_channels, num_classes)


# ---- data ----------------------------------------------------------------------------------------


@dataclass
class Images:
    """uint8 images (N, H, W, C) and integer labels."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


def load_digits_images() -> tuple[Images, list[str]]:
    from sklearn.datasets import load_digits  # heavy: sklearn

    d = load_digits()
    x = (d.images * (255 / 16)).round().astype(np.uint8)[..., None]  # 0..16 gray levels -> 0..255
    return Images(x, d.target.astype(np.int64)), [str(i) for i in range(10)]


class _CifarUnpickler(pickle.Unpickler):
    """A CIFAR batch is a dict of bytes, strings, lists and numpy arrays: those are the only classes a
    batch may name. Plain `pickle.load` would run whatever a file from an untrusted directory says."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR batch holds")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            d = _CifarUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: not a CIFAR-10 python batch, refused ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: not a CIFAR-10 python batch (a {type(d).__name__}, not a dict)")
    return d


def _cifar_batch(path: Path) -> Images:
    d = _unpickle(path)
    try:
        x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return Images(x, np.asarray(d["labels"], dtype=np.int64))
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError(f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None


def is_cifar_dir(path: Path) -> bool:
    return (path / "data_batch_1").is_file() and (path / "batches.meta").is_file()


def load_cifar10(path: Path) -> tuple[Images, Images, list[str]]:
    """The CIFAR-10 "python version" (cifar-10-batches-py): data_batch_1..5 and test_batch."""
    parts = [_cifar_batch(p) for p in sorted(path.glob("data_batch_*"))]
    train = Images(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))
    test = _cifar_batch(path / "test_batch") if (path / "test_batch").is_file() else Images(train.x[:0], train.y[:0])
    names = _unpickle(path / "batches.meta").get("label_names")
    if not isinstance(names, list):
        raise ConfigError(f"{path / 'batches.meta'}: no label_names list; not a CIFAR-10 python directory")
    return train, test, [str(n) for n in names]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def load_image_folder(path: Path, size: int) -> tuple[Images, list[str]]:
    """One sub-directory per class; every image converted to RGB and resized to size x size."""
    from PIL import Image, UnidentifiedImageError  # heavy: PIL

    classes = sorted(p.name for p in path.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise ConfigError(f"image folder {path}: needs one sub-directory per class, found {len(classes)}")
    xs, ys = [], []
    for label, name in enumerate(classes):
        for file in sorted((path / name).iterdir()):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(file) as im:
                    xs.append(np.asarray(im.convert("RGB").resize((size, size)), dtype=np.uint8))
            except (UnidentifiedImageError, OSError) as e:
                raise ConfigError(f"{file}: not a readable image ({e})") from None
            ys.append(label)
    if not xs:
        raise ConfigError(f"image folder {path}: no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    return Images(np.stack(xs), np.asarray(ys, dtype=np.int64)), classes


def save_images(path: Path, train: Images, evals: Images) -> None:
    np.savez(path, train_x=train.x, train_y=train.y, eval_x=evals.x, eval_y=evals.y)


def read_images(path: Path) -> tuple[Images, Images]:
    d = np.load(path)
    return Images(d["train_x"], d["train_y"]), Images(d["eval_x"], d["eval_y"])


class ImageDataset(torch.utils.data.Dataset):
    """Per-sample decode work: uint8 -> float, normalise, and (training) a random shift by up to
    1/8 of the side plus, for photos (3 channels), a horizontal flip. The augmentation of sample i
    is fixed by (seed, i), so trials see the same data."""

    def __init__(self, images: Images, train: bool, seed: int):
        self.images, self.train, self.seed = images, train, seed
        x = images.x.astype(np.float32) / 255
        self.mean = x.mean(axis=(0, 1, 2)) if len(x) else np.zeros(images.x.shape[-1], np.float32)
        self.std = (x.std(axis=(0, 1, 2)) if len(x) else np.ones_like(self.mean)) + 1e-6

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = (self.images.x[i].astype(np.float32) / 255 - self.mean) / self.std  # H, W, C
        if self.train:
            rng = np.random.default_rng((self.seed, i))
            pad = max(1, img.shape[0] // 8)
            padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
            dy, dx = rng.integers(0, 2 * pad + 1, size=2)
            img = padded[dy : dy + img.shape[0], dx : dx + img.shape[1]]
            if img.shape[2] == 3 and rng.random() < 0.5:
                img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), int(self.images.y[i])


def collate_images(items: list[tuple[torch.Tensor, int]]) -> Batch:
    x = torch.stack([t for t, _ in items])
    n = len(items)
    labels = torch.tensor([y for _, y in items], dtype=torch.long)
    pixels = n * x.shape[-1] * x.shape[-2]  # "tokens" of an image batch: pixels, never padding
    return Batch({"pixel_values": x}, labels, n, pixels, pixels, n)


def load_image_data(dataset: str | None, train_file: str | None, eval_file: str | None, image_size: int):
    """(train, eval, class names) for image-classification: the built-in digits, a CIFAR-10 python
    directory, or image folders. Without an eval set, a deterministic 10% is held out."""
    evals: Images | None = None
    if train_file is None:
        if dataset not in (None, "digits"):
            raise ConfigError(
                f"image-classification: unknown dataset {dataset!r}; built-in: digits (or --train-file DIR)"
            )
        train, names = load_digits_images()
    else:
        path = Path(train_file)
        if not path.is_dir():
            raise ConfigError(
                f"--train-file {train_file}: image-classification reads a directory (CIFAR-10 "
                "cifar-10-batches-py, or one sub-directory of images per class)"
            )
        if is_cifar_dir(path):
            train, test, names = load_cifar10(path)
            evals = test if len(test) else None
        else:
            train, names = load_image_folder(path, image_size)
        if eval_file:
            eval_path = Path(eval_file)
            if not eval_path.is_dir():
                raise ConfigError(f"--eval-file {eval_file}: not a directory of class folders")
            evals, eval_names = load_image_folder(eval_path, image_size)
            if eval_names != names:
                raise ConfigError(f"--eval-file {eval_file}: its classes {eval_names} differ from {names}")
    if evals is None:
        order = np.random.default_rng(1234).permutation(len(train))
        n_eval = max(1, len(train) // 10)
        held, kept = order[:n_eval], order[n_eval:]
        train, evals = Images(train.x[kept], train.y[kept]), Images(train.x[held], train.y[held])
    return train, evals, names
