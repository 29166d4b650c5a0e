"""A Hugging Face style workload: dict samples, and a model that returns .logits and .loss.

``text_classifier.yaml`` names these functions. Each sample is what a tokenizer gives a text
classifier, ``{"input_ids", "attention_mask", "labels"}``, padded to a fixed length; the model
takes them as keyword arguments and, given ``labels``, computes its own loss (``loss: model``
in the space file), as ``transformers``' ``...ForSequenceClassification`` models do. The texts
are generated (nothing is downloaded): each is about one of four topics, and a topic's words
are most of its tokens, mixed with common words.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

SHARE = 0.6  # of a text's tokens that are its topic's words
PAD, VOCAB, TOPICS = 0, 512, ("sport", "science", "music", "politics")


class Texts(Dataset):
    """Token ids of generated texts, padded to ``length``; the label is the text's topic."""

    classes = TOPICS

    def __init__(self, size: int, length: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        words_per_topic = (VOCAB - 1) // (len(TOPICS) + 1)  # the last share: common words
        self.labels = torch.randint(len(TOPICS), (size,), generator=generator)
        topic_words = 1 + self.labels[:, None] * words_per_topic
        topical = topic_words + torch.randint(words_per_topic, (size, length), generator=generator)
        common_start = 1 + len(TOPICS) * words_per_topic
        common = common_start + torch.randint(
            VOCAB - common_start, (size, length), generator=generator
        )
        self.ids = torch.where(
            torch.rand(size, length, generator=generator) < SHARE, topical, common
        )
        self.lengths = torch.randint(length // 4, length + 1, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        mask = torch.arange(self.ids.shape[1]) < self.lengths[index]
        return {
            "input_ids": torch.where(mask, self.ids[index], PAD),
            "attention_mask": mask.long(),
            "labels": self.labels[index],
        }


def topics(train_size: int = 2000, val_size: int = 500, length: int = 32):
    """Generated topic-classification texts: (train, validation), disjoint by seed."""
    return Texts(train_size, length, seed=0), Texts(val_size, length, seed=1)


@dataclass
class ClassifierOutput:
    """What a ``transformers`` classifier returns: the logits, and the loss when given labels."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TextClassifier(nn.Module):
    """Token and position embeddings, a small Transformer encoder, mean pooling, a linear head."""

    def __init__(self, num_classes: int, width: int, layers: int, heads: int, length: int = 512):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width, padding_idx=PAD)
        self.positions = nn.Embedding(length, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, num_classes)

    def forward(self, input_ids, attention_mask, labels=None) -> ClassifierOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.tokens(input_ids) + self.positions(positions)
        hidden = self.encoder(hidden, src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        logits = self.head((hidden * mask).sum(1) / mask.sum(1))
        loss = None if labels is None else nn.functional.cross_entropy(logits.float(), labels)
        return ClassifierOutput(logits=logits, loss=loss)


def transformer(num_classes: int, width: int = 64, layers: int = 1, heads: int = 4):
    """A text classifier of ``layers`` Transformer layers ``width`` wide."""
    return TextClassifier(num_classes, width, layers, heads)
