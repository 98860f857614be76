"""Which printed names are steps and which are metrics, for the generic reader.

Trainers name the same thing many ways (`train_loss`, `lm loss`, `loss/train`; `gnorm`, `grad
norm`, `total_grad_norm`; `tok/sec`, `tokens/s/device`). Names are compared normalised (`norm`:
lower case, without spaces, `_` and `-`), so a table entry covers its spellings. The table is
`SYNONYMS`; a config's `formats.synonyms` adds to it (`Names(extra=...)`).

Counters rank: where a line prints several (`iter 1152 step 144`, `epoch 001: 100 / 1975 ...
num_updates=100`), the finest that counts updates wins; an epoch is the step only where nothing
finer is printed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradwatch.errors import ConfigError
from gradwatch.records import METRICS

#: normalised name -> canonical metric (see `gradwatch.records.METRICS`)
SYNONYMS: dict[str, str] = {
    **dict.fromkeys(
        ("loss", "trainloss", "train/loss", "loss/train", "lmloss", "totalloss", "loss/total", "train/lmloss"), "loss"
    ),
    **dict.fromkeys(
        ("valloss", "validloss", "validationloss", "evalloss", "val/loss", "valid/loss", "eval/loss", "loss/val"),
        "val_loss",
    ),
    **dict.fromkeys(
        ("gradnorm", "gnorm", "gradientnorm", "totalgradnorm", "globalgradnorm", "grad/norm", "train/gradnorm"),
        "grad_norm",
    ),
    **dict.fromkeys(("lr", "learningrate", "train/lr", "train/learningrate"), "lr"),
    **dict.fromkeys(("scale", "lossscale", "train/lossscale"), "loss_scale"),
    **dict.fromkeys(("ppl", "perplexity", "train/ppl", "train/perplexity"), "ppl"),
    **dict.fromkeys(("zloss", "train/zloss"), "z_loss"),
    **dict.fromkeys(("logitnorm", "outputlogitnorm"), "logit_norm"),
    **dict.fromkeys(
        (
            "tokens/s",
            "tokens/sec",
            "tok/s",
            "tok/sec",
            "tps",
            "tokenspersecond",
            "tokens/s/device",
            "tokens/s/gpu",
            "tgs",
            "tgs(tokens/gpu/second)",
            "wps",
        ),
        "tps",
    ),
    **dict.fromkeys(("tflops", "tflop/s", "tflop/s/device", "tflops/gpu", "tflops/device"), "tflops"),
    "mfu": "mfu",
    **dict.fromkeys(
        ("time(ms)", "itertime", "iterationtime", "steptime", "steptime(s)", "dt", "time", "seconds", "sec/step"),
        "step_time_s",
    ),
    **dict.fromkeys(("it/s", "it/sec", "steps/s", "steps/sec"), "step_rate"),
    **dict.fromkeys(("trainedtokens", "numconsumedtokens", "consumedtokens", "tokensseen"), "tokens"),
}

#: normalised counter name -> rank (lower wins when a line prints several)
COUNTERS: dict[str, int] = {
    **dict.fromkeys(("globalstep", "trainer/globalstep"), 0),
    **dict.fromkeys(("numupdates", "nupdates", "train/nupdates"), 1),
    **dict.fromkeys(("iter", "iteration", "iterations", "time/iterations"), 2),
    **dict.fromkeys(("step", "trainstep", "completedstep", "trainer/step"), 3),
    "batch": 5,
    "epoch": 6,
}
#: rank of a progress count (a bar's `n/total`, a bracketed `[i/n]`): finer than an epoch
PROGRESS_RANK = 4
EPOCH_RANK = COUNTERS["epoch"]

#: names whose value is an evaluation's, never the training loss
_NOT_TRAINING = ("val", "eval", "test", "scale")
#: unit glued to a time -> seconds
_SECONDS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def norm(name: str) -> str:
    """`Train Loss`, `train_loss` and `train-loss` alike: lower case without spaces, `_`, `-`."""
    return name.lower().replace(" ", "").replace("_", "").replace("-", "").strip("'\"")


@dataclass(frozen=True)
class Metric:
    """What a printed name stands for: a canonical metric and how to convert its value."""

    name: str
    #: factor to the canonical unit (ms -> s); a rate (`it/s`) is inverted into a step time
    scale: float = 1.0
    inverted: bool = False

    def value(self, number: float, unit: str) -> float:
        if self.inverted:
            return 1.0 / number if number else math.nan
        if self.name == "step_time_s":
            return number * _SECONDS.get(unit, self.scale)
        return number * self.scale


@dataclass(frozen=True)
class Meaning:
    """What a printed name is: a counter (its rank), a metric, or a loss of the trainer's own
    naming (`loss_like`); all None/False for a name we do not know."""

    rank: int | None = None
    metric: Metric | None = None
    loss_like: bool = False


class Names:
    """The synonym table in force: the built-in one and a config's additions."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        table = dict(SYNONYMS)
        for key, target in (extra or {}).items():
            if target not in METRICS:
                raise ConfigError(
                    f"formats.synonyms {key!r}: {target!r} is not a metric name; use one of: {', '.join(METRICS)}"
                )
            table[norm(key)] = target
        self._table = table
        self._cache: dict[str, Meaning] = {}

    def meaning(self, key: str) -> Meaning:
        """What a printed name stands for (names are cached: a log repeats its few keys)."""
        found = self._cache.get(key)
        if found is None:
            name = norm(key)
            found = Meaning(COUNTERS.get(name), self._lookup(name), _loss_like(name))
            if len(self._cache) < 4096:
                self._cache[key] = found
        return found

    def _lookup(self, name: str) -> Metric | None:
        if name.endswith("(ms)"):
            inner = self._lookup(name[:-4])
            return Metric(inner.name, 1e-3) if inner and inner.name == "step_time_s" else inner
        if name.endswith("step") and name[:-4] in self._table:  # Lightning's `train_loss_step`
            name = name[:-4]
        target = self._table.get(name)
        if target == "step_rate":
            return Metric("step_time_s", inverted=True)
        return Metric(target) if target else None


def _loss_like(name: str) -> bool:
    """A (normalised) name that holds a training loss of the trainer's own naming (`closs`,
    `loss_disc`, `aeloss_step`): where a line has no loss of a known name, the first such one
    stands in."""
    return "loss" in name and not any(word in name for word in _NOT_TRAINING)
