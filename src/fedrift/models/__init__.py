"""Models (registry ``MODELS``) and :func:`build_model`, the one way to make one.

A registry entry's factory has the signature ``factory(options, input_shape, num_classes)``
and returns a :class:`~fedrift.models.base.FedModel`; it draws its initial weights from the
global torch RNG, which :func:`build_model` seeds inside a fork so the caller's RNG state is
left as it was. Models that take only some input shapes register a shape check with
:func:`register_model`, so a mismatch is refused with the models that do take the shape.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from fedrift.errors import ConfigError
from fedrift.models.base import FedModel
from fedrift.registry import Registry, source_of

MODELS: Registry = Registry("model")

ShapeCheck = Callable[[tuple[int, ...]], "str | None"]
"""``check(input_shape)``: None when the model takes the shape, else what it needs."""

_SHAPE_CHECKS: dict[str, ShapeCheck] = {}


def register_model(
    name: str, doc: str, params: type | None = None, check: ShapeCheck | None = None
) -> Callable[[Callable[..., FedModel]], Callable[..., FedModel]]:
    """Register a model factory; ``check`` says which input shapes it takes (default: all).

    The registered factory refuses a shape its check rejects, naming the models that take it.
    """

    def add(factory: Callable[..., FedModel]) -> Callable[..., FedModel]:
        def checked(options: Any, input_shape: tuple[int, ...], num_classes: int) -> FedModel:
            shape = tuple(int(s) for s in input_shape)
            problem = shape_problem(name, shape)
            if problem is not None:
                takers = models_for_shape(shape)
                raise ConfigError(
                    f"model.name: {name} cannot take input shape {shape} ({problem}); "
                    f"models that take {shape}: {', '.join(takers) if takers else 'none'}"
                )
            return factory(options, shape, num_classes)

        MODELS.register(name, doc, params, source_of(factory.__module__))(checked)
        if check is not None:
            _SHAPE_CHECKS[name] = check
        return factory

    return add


def shape_problem(name: str, input_shape: tuple[int, ...]) -> str | None:
    """Why model ``name`` cannot take ``input_shape``, or None if it can."""
    check = _SHAPE_CHECKS.get(name)
    return None if check is None else check(tuple(input_shape))


def models_for_shape(input_shape: tuple[int, ...]) -> list[str]:
    """The registered models that take ``input_shape``, sorted by name."""
    return [n for n in MODELS.names() if shape_problem(n, input_shape) is None]


def needs_image(min_side: int) -> ShapeCheck:
    """A shape check for models taking ``(channels, height, width)``, sides >= ``min_side``."""

    def check(shape: tuple[int, ...]) -> str | None:
        if len(shape) != 3 or shape[0] < 1:
            return "needs (channels, height, width)"
        if min(shape[1:]) < min_side:
            return f"needs height and width of at least {min_side}"
        return None

    return check


# Importing the modules registers their factories.
from fedrift.models import cnn, mlp, resnet, text  # noqa: E402,F401
from fedrift.models import alexnet  # noqa: E402,F401
from fedrift.models import fedadc_cnn  # noqa: E402,F401


def build_model(
    name: str, options: Any, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> FedModel:
    """Build model ``name`` for inputs of ``input_shape`` (no batch dimension).

    ``options`` is an instance of the entry's params class (None: its defaults). The
    initial weights are a pure function of ``seed``: they are drawn inside
    ``torch.random.fork_rng`` from a freshly seeded CPU generator, so the caller's global
    RNG state is the same after the call as before, one build at a time in the process (so
    builds in several threads at once each get their seed's weights).
    """
    entry = MODELS.get(name, "model.name")
    shape = tuple(int(s) for s in input_shape)
    if num_classes < 1:
        raise ConfigError(f"model: num_classes must be at least 1 (got {num_classes})")
    if options is None and entry.params is not None:
        options = entry.params()
    # one build at a time in this process: the generator is global, and a build in another
    # thread between the seeding and the draws would take some of them (a Flower deployment's
    # app written beside a simulation changed the simulation's initial weights)
    with _SEEDED_BUILD, torch.random.fork_rng(devices=[]):
        # The CPU generator only: torch.manual_seed would also reseed (and so change) the
        # caller's CUDA generators, which fork_rng(devices=[]) does not restore.
        torch.default_generator.manual_seed(int(seed))
        model = entry.factory(options, shape, int(num_classes))
    return model


_SEEDED_BUILD = threading.RLock()  # re-entrant: a factory may build a sub-model through build_model


__all__ = [
    "MODELS",
    "FedModel",
    "build_model",
    "models_for_shape",
    "register_model",
    "shape_problem",
]
