"""Task metrics: accuracy; ROUGE-1/2/L (rouge-score) and BLEU (sacrebleu) for generated text; METEOR and
CIDEr (pycocoevalcap, the COCO caption evaluation seed 002 reported) with the optional extra `captioning`.

`evaluate.load("rouge")` needs the network; these packages compute the same scores offline. METEOR is
Java (pycocoevalcap's meteor-1.5.jar): it is computed where `java` is on PATH, by one JVM kept for the
process (its start, ~7 s on 2 cores, is paid once per trial, not per evaluation); TRAINWISE_METEOR=0 skips it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from typing import Any

from trainwise.core.config import CAUSAL_LM

_meteor: list[Any] = []  # the process's METEOR scorer (a JVM), started on first use


def accuracy(pred: list[int], gold: list[int]) -> float:
    assert len(pred) == len(gold) and gold, "accuracy needs equal, non-empty lists"
    return sum(int(p == g) for p, g in zip(pred, gold, strict=True)) / len(gold)


# what text_metrics imports (rouge-score stems with nltk's Porter stemmer), by import name and pip name
TEXT_METRIC_PACKAGES = {"rouge_score": "rouge-score", "nltk": "nltk", "sacrebleu": "sacrebleu"}
# the modules themselves, and the switch that has a study whose trials score generated text import them once, in the
# process its trials fork from (trainwise.run.launcher.warm), not in each trial: rouge_scorer's import alone takes
# 2.4 s on a 2-core EPYC. The test suite sets it (tests/conftest.py: hundreds of evaluating trials); off by default, as
# a forked trial's RSS would then hold nltk, SciPy and scikit-learn (+85 MiB, BENCHMARKS §S4)
TEXT_METRIC_MODULES = ("rouge_score.rouge_scorer", "sacrebleu", "sacrebleu.metrics")
PRELOAD_ENV = "TRAINWISE_PRELOAD_METRICS"


def preloaded(task: str, eval_samples: int) -> tuple[str, ...]:
    """What the trials' zygote imports for a study of `task` beyond every trial's: the text metrics where PRELOAD_ENV
    is 1 and the trials score generated text (seq2seq; a causal LM's answers), else nothing."""
    scored = task in ("seq2seq", CAUSAL_LM) and eval_samples > 0
    return TEXT_METRIC_MODULES if scored and os.environ.get(PRELOAD_ENV) == "1" else ()


def missing_text_metric_packages() -> list[str]:
    """The pip names of the packages text_metrics needs that this environment cannot import (empty: none)."""
    return [pip for name, pip in TEXT_METRIC_PACKAGES.items() if importlib.util.find_spec(name) is None]


def text_metrics(pred: list[str], gold: list[str]) -> dict[str, float]:
    """ROUGE F1 x100 (mean over samples, stemmed), corpus BLEU, and BLEU-1..4 (cumulative: the geometric
    mean of the 1..n-gram precisions with the brevity penalty, seed 002's columns), all x100."""
    import sacrebleu  # heavy: sacrebleu
    from rouge_score import rouge_scorer  # heavy: rouge_score
    from sacrebleu.metrics import BLEU  # heavy: sacrebleu

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    sums = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for p, g in zip(pred, gold, strict=True):
        scores = scorer.score(g, p)
        for k in sums:
            sums[k] += scores[k].fmeasure
    out = {k: 100 * v / max(1, len(gold)) for k, v in sums.items()}
    out["bleu"] = float(sacrebleu.corpus_bleu(pred, [gold]).score)
    for n in (1, 2, 3, 4):
        out[f"bleu{n}"] = float(BLEU(max_ngram_order=n).corpus_score(pred, [gold]).score)
    return {**out, **caption_metrics(pred, gold)}


def _words(text: str) -> str:
    """COCO's evaluation tokenises with Stanford's PTBTokenizer (Java); lower-cased words without
    punctuation are what it leaves for these metrics."""
    return " ".join(re.findall(r"[\w']+", text.lower()))


def caption_metrics(pred: list[str], gold: list[str]) -> dict[str, float]:
    """CIDEr (pycocoevalcap's: CIDEr-D's clipping and length penalty, TF-IDF over these references) and
    METEOR 1.5, both x100; {} without the `captioning` extra; no METEOR without Java, with TRAINWISE_METEOR=0,
    or when its JVM fails."""
    try:
        from pycocoevalcap.cider.cider import Cider  # optional: trainwise[captioning]
    except ImportError:
        return {}
    if not gold:
        return {}
    refs = {i: [_words(g)] for i, g in enumerate(gold)}
    hyps = {i: [_words(p)] for i, p in enumerate(pred)}
    out = {"cider": 100 * float(Cider().compute_score(refs, hyps)[0])}
    if shutil.which("java") is None or os.environ.get("TRAINWISE_METEOR") == "0":
        return out
    try:
        if not _meteor:
            from pycocoevalcap.meteor.meteor import Meteor  # optional: trainwise[captioning]

            _meteor.append(Meteor())
        out["meteor"] = 100 * float(_meteor[0].compute_score(refs, hyps)[0])
    except Exception as err:  # a JVM that cannot start (memory) or died: the other metrics stand
        print(f"trainwise: METEOR not computed ({type(err).__name__}: {err})", file=sys.stderr)
        _meteor.clear()
    return out
