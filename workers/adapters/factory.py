"""Build the model adapter named by the `model_adapter` setting.

Vendor adapters are imported only when chosen, so the scripted default
needs nothing but the standard library.
"""

from __future__ import annotations

from broker import errors
from broker.models import default_model
from broker.settings import Settings
from workers.model import ModelAdapter

ADAPTERS = ("scripted", "openai", "anthropic")


def make_adapter(settings: Settings) -> ModelAdapter:
    name = settings.model_adapter
    timeout_s = settings.model_timeout_s
    if name == "scripted":
        from .scripted import ScriptedAdapter

        return ScriptedAdapter(settings.scripted_tokens_per_s, settings.scripted_slow_tool_s)
    if name == "openai":
        from .openai import OpenAIAdapter

        return OpenAIAdapter(
            settings.openai_base_url,
            settings.openai_api_key,
            settings.openai_model,
            first_byte_timeout_s=timeout_s,
            read_timeout_s=timeout_s,
        )
    if name == "anthropic":
        from .anthropic import AnthropicAdapter

        adapter: ModelAdapter = AnthropicAdapter(
            settings.anthropic_base_url,
            settings.anthropic_api_key,
            settings.anthropic_model,
            first_byte_timeout_s=timeout_s,
            read_timeout_s=timeout_s,
        )
        return adapter
    raise errors.ClientError(
        f"unknown model_adapter {name!r}", hint=f"choose one of {', '.join(ADAPTERS)}"
    )


def model_name(adapter: ModelAdapter, settings: Settings) -> str:
    """The model a run reports in run_start when the run did not ask for one
    (the adapter's default, which the allow-list always allows)."""
    return default_model(settings, adapter.name) or str(getattr(adapter, "model", adapter.name))


async def close_adapter(adapter: ModelAdapter) -> None:
    aclose = getattr(adapter, "aclose", None)
    if aclose is not None:
        await aclose()
