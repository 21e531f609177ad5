"""Task metrics: accuracy; ROUGE-1/2/L (rouge-score) and BLEU (sacrebleu) for generated text.

`evaluate.load("rouge")` needs the network; these two packages compute the same scores offline.
"""

from __future__ import annotations


def accuracy(pred: list[int], gold: list[int]) -> float:
    assert len(pred) == len(gold) and gold, "accuracy needs equal, non-empty lists"
    return sum(int(p == g) for p, g in zip(pred, gold, strict=True)) / len(gold)


def text_metrics(pred: list[str], gold: list[str]) -> dict[str, float]:
    """ROUGE F1 x100 (mean over samples, stemmed), corpus BLEU, and BLEU-1..4 (cumulative: the geometric
    mean of the 1..n-gram precisions with the brevity penalty, seed 002's columns), all x100."""
    import sacrebleu
    from rouge_score import rouge_scorer
    from sacrebleu.metrics import BLEU

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
    return out
