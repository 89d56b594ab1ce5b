"""Which model a run may ask for: the allow-list, one rule for gateways and workers.

A run's `model` is sent to the provider on the operator's key, so it is the
operator's choice, not the approver's: a run may name "" (the adapter's
default), the configured adapter's default model, or a name in the `models`
setting, compared exactly (no trimming, no case folding). The gateway refuses
anything else before the run exists (`model_not_allowed`, 400); a worker that
gets such a run anyway (a gateway configured otherwise) fails it with the same
code without calling the provider. Here, in broker/, so that the gateway can
apply it without importing the worker.
"""

from __future__ import annotations

from broker import errors
from broker.settings import Settings

# The model the scripted demo adapter reports (workers/adapters/scripted.py).
SCRIPTED_MODEL = "scripted-demo"


def default_model(settings: Settings, adapter: str | None = None) -> str:
    """The default model of `adapter` (default: the model_adapter setting); ""
    for an adapter not configured here."""
    name = settings.model_adapter if adapter is None else adapter
    return {
        "scripted": SCRIPTED_MODEL,
        "openai": settings.openai_model,
        "anthropic": settings.anthropic_model,
    }.get(name, "")


def listed(settings: Settings) -> list[str]:
    """The names in the `models` setting."""
    return [m.strip() for m in settings.models.split(",") if m.strip()]


def is_allowed(settings: Settings, model: str, *, default: str) -> bool:
    """Whether a run may ask for `model` when the adapter's default is `default`."""
    return model in ("", default) or model in listed(settings)


def check(settings: Settings, model: str) -> None:
    """ModelNotAllowed unless a run may ask for `model` (the gateway's check)."""
    default = default_model(settings)
    if not is_allowed(settings, model, default=default):
        allowed = ", ".join(dict.fromkeys(m for m in (default, *listed(settings)) if m))
        raise errors.ModelNotAllowed(
            f"model {model!r} is not allowed on this deployment",
            hint=f"omit model for the default, or use one of: {allowed}",
        )
