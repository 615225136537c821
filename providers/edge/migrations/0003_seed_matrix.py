"""Seed the curated matrix with a deliberately small set of current-generation,
tool-calling models.

Every number below was read from the vendor's model page (or, for OpenAI, a gateway's
listing of it) when this was written; a figure that was not found there is left empty
(None), never estimated: the context meter hides and cost stays unknown rather than
showing a made-up value. Admins edit the rows afterwards; this migration only adds rows
whose id is not taken, and its reverse removes only rows it would have added.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import migrations

SEED = [
    {
        # platform.claude.com/docs/en/models/sonnet-5/overview: 1M context, 128K output,
        # $2 / $10, 5-minute cache write $2.50, cache read $0.20, adaptive thinking.
        "model_id": "anthropic:claude-sonnet-5",
        "label": "Claude Sonnet 5",
        "provider": "anthropic",
        "vision": True,
        "pdf": True,
        "tools": True,
        "reasoning": True,
        "thinking": "adaptive",
        "context_window": 1_000_000,
        "max_output_tokens": 128_000,
        "price_input": Decimal("2"),
        "price_output": Decimal("10"),
        "price_cache_read": Decimal("0.20"),
        "price_cache_write": Decimal("2.50"),
        "order": 10,
    },
    {
        # Model pages' comparison table: 200K context, 64K output, $1 / $5, extended
        # thinking (a token budget). Cache prices were not on the pages read: left empty.
        "model_id": "anthropic:claude-haiku-4-5",
        "label": "Claude Haiku 4.5",
        "provider": "anthropic",
        "vision": True,
        "pdf": True,
        "tools": True,
        "reasoning": True,
        "thinking": "budget",
        "context_window": 200_000,
        "max_output_tokens": 64_000,
        "price_input": Decimal("1"),
        "price_output": Decimal("5"),
        "order": 20,
    },
    {
        # Listed with tool use, reasoning, vision and file input; 1M context, 272K output,
        # $5 / $30. The cached-input price was not found: left empty.
        "model_id": "openai:gpt-5.5",
        "label": "GPT-5.5",
        "provider": "openai",
        "vision": True,
        "pdf": True,
        "tools": True,
        "reasoning": True,
        "thinking": "effort",
        "context_window": 1_000_000,
        "max_output_tokens": 272_000,
        "price_input": Decimal("5"),
        "price_output": Decimal("30"),
        "order": 30,
    },
]


def seed(apps, schema_editor):
    matrix_model = apps.get_model("providers", "MatrixModel")
    for row in SEED:
        fields = {key: value for key, value in row.items() if key != "model_id"}
        matrix_model.objects.get_or_create(model_id=row["model_id"], defaults=fields)


def unseed(apps, schema_editor):
    matrix_model = apps.get_model("providers", "MatrixModel")
    matrix_model.objects.filter(model_id__in=[row["model_id"] for row in SEED]).delete()


class Migration(migrations.Migration):
    dependencies = [("providers", "0002_matrix")]

    operations = [migrations.RunPython(seed, unseed)]
