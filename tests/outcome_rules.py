"""The experiment outcome rules of docs/experiment.md, written again from the text (not from fastflip's code)."""


def independent_outcome(run, golden, tol, chance, margin):
    """The outcome rules of docs/experiment.md, written again from the text, for epoch-boundary runs."""
    g = {row["epoch"]: row for row in golden}
    bad = lambda v: v is not None and (v != v or v in (float("inf"), float("-inf")))  # noqa: E731
    left = []
    for p in run:
        gp = g[p["epoch"]]
        out = any(bad(p.get(k)) for k in ("loss", "train_accuracy", "val_loss", "accuracy"))
        out |= p["accuracy"] < gp["accuracy"] - tol
        if p["phase"] == "train" and p.get("train_accuracy") is not None:
            out |= p["train_accuracy"] < gp["train_accuracy"] - tol
        left.append(out)
    end = run[-1]
    if any(bad(end.get(k)) for k in ("loss", "train_accuracy", "val_loss", "accuracy")) or end["accuracy"] <= chance + margin:
        return "diverged", None
    if left[-1]:
        return "degraded", None
    if True not in left:
        return "masked", 0
    return "recovered", len(left) - left[::-1].index(True)
