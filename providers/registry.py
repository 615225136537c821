"""Provider descriptors: which wire API a provider speaks and its vendor quirks.

Declarations over code: adding an OpenAI-compatible vendor is one `ProviderDescriptor`
here, not a branch in the streaming code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Wire APIs a descriptor can name.
OPENAI_COMPLETIONS = "openai-completions"
OPENAI_RESPONSES = "openai-responses"
ANTHROPIC_MESSAGES = "anthropic-messages"
GEMINI = "gemini"
BEDROCK_CONVERSE = "bedrock-converse"


@dataclass(frozen=True)
class CompatFlags:
    """Differences between OpenAI-compatible Chat Completions vendors."""

    # Send the system prompt as a `developer` message instead of `system`.
    developer_role: bool = False
    # Field that caps the reply length: OpenAI's current name or the legacy one.
    max_tokens_field: str = "max_tokens"
    # Whether `stream_options: {"include_usage": true}` is accepted (usage in the stream).
    usage_in_stream: bool = True
    # Where streamed/returned reasoning text lives on the delta/message, if anywhere.
    reasoning_field: str | None = None
    # Tool-result messages must carry the function `name` too.
    tool_result_name: bool = False
    # Function definitions accept `strict`.
    strict_tools: bool = True
    # How the request carries `reasoning_effort` (see providers/reasoning.py): None (no
    # field), "reasoning_effort" (top-level level string), "reasoning" ({"effort": ...}).
    reasoning_effort_param: str | None = None
    # The value that switches reasoning off, where the vendor has one for every model.
    reasoning_effort_off: str | None = None
    # The vendor's thinking mode refuses a tool loop unless each earlier assistant message
    # carries its `reasoning_content` back (DeepSeek: "Missing `reasoning_content` field in
    # the assistant message"). The reply's reasoning is kept in a `_<provider>` sidecar
    # and replayed to the same model only (providers/wire/openai_completions.py).
    replay_reasoning_content: bool = False
    # Reasoning comes as typed `thinking` chunks in `content` and goes back the same way:
    # the same model's assistant messages are replayed with their thinking chunk first
    # (Mistral: dropping the trace degrades its reasoning models). Kept in a `_<provider>`
    # sidecar like `replay_reasoning_content`; other models' turns go as plain text.
    replay_thinking_chunks: bool = False
    # Tool-call ids must be exactly this many characters of [a-zA-Z0-9] (Mistral: 9, a 422
    # otherwise). Ids of another shape (another vendor's `toolu_...`, `call_0_...`) are
    # re-keyed on the way out, the call and its result alike; the transcript keeps them.
    tool_call_id_length: int | None = None


@dataclass(frozen=True)
class ProviderDescriptor:
    name: str
    api: str
    default_base_url: str
    # "bearer" (Authorization: Bearer), "x-api-key" (Anthropic), "none", and later
    # "x-goog-api-key" / "sigv4" for the APIs that use them.
    auth: str = "bearer"
    requires_key: bool = True
    compat: CompatFlags = field(default_factory=CompatFlags)
    label: str = ""


_DESCRIPTORS: dict[str, ProviderDescriptor] = {}


def register(descriptor: ProviderDescriptor) -> ProviderDescriptor:
    _DESCRIPTORS[descriptor.name] = descriptor
    return descriptor


def get_descriptor(name: str) -> ProviderDescriptor | None:
    return _DESCRIPTORS.get(name)


def provider_names() -> list[str]:
    return sorted(_DESCRIPTORS)


register(
    ProviderDescriptor(
        name="openai",
        label="OpenAI",
        # Responses, not Chat Completions: reasoning + tools at real effort levels (seed
        # 000). The compat flags stay for anything that still speaks Completions to it.
        api=OPENAI_RESPONSES,
        default_base_url="https://api.openai.com/v1",
        compat=CompatFlags(
            developer_role=True,
            max_tokens_field="max_completion_tokens",
            reasoning_effort_param="reasoning_effort",
        ),
    )
)
register(
    ProviderDescriptor(
        name="anthropic",
        label="Anthropic",
        api=ANTHROPIC_MESSAGES,
        default_base_url="https://api.anthropic.com",
        auth="x-api-key",
    )
)
register(
    ProviderDescriptor(
        name="ollama",
        label="Ollama",
        api=OPENAI_COMPLETIONS,
        default_base_url="http://localhost:11434/v1",
        auth="none",
        requires_key=False,
        compat=CompatFlags(reasoning_field="reasoning", strict_tools=False),
    )
)
register(
    ProviderDescriptor(
        name="deepseek",
        label="DeepSeek",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://api.deepseek.com/v1",
        compat=CompatFlags(
            reasoning_field="reasoning_content",
            strict_tools=False,
            replay_reasoning_content=True,
        ),
    )
)
register(
    ProviderDescriptor(
        name="together",
        label="Together AI",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://api.together.xyz/v1",
        compat=CompatFlags(reasoning_field="reasoning", strict_tools=False),
    )
)
register(
    ProviderDescriptor(
        name="groq",
        label="Groq",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://api.groq.com/openai/v1",
        compat=CompatFlags(
            reasoning_field="reasoning",
            strict_tools=False,
            reasoning_effort_param="reasoning_effort",
        ),
    )
)
register(
    ProviderDescriptor(
        name="openrouter",
        label="OpenRouter",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://openrouter.ai/api/v1",
        compat=CompatFlags(
            reasoning_field="reasoning",
            strict_tools=False,
            reasoning_effort_param="reasoning",
            reasoning_effort_off="none",
        ),
    )
)
register(
    ProviderDescriptor(
        name="mistral",
        label="Mistral",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://api.mistral.ai/v1",
        # Mistral validates strictly: no `stream_options` in its schema (usage comes in
        # the last chunk anyway), and tool-call ids of exactly nine letters and digits.
        compat=CompatFlags(
            tool_result_name=True,
            strict_tools=False,
            usage_in_stream=False,
            replay_thinking_chunks=True,
            tool_call_id_length=9,
        ),
    )
)
register(
    ProviderDescriptor(
        name="xai",
        label="xAI",
        api=OPENAI_COMPLETIONS,
        default_base_url="https://api.x.ai/v1",
        compat=CompatFlags(
            reasoning_field="reasoning_content", reasoning_effort_param="reasoning_effort"
        ),
    )
)
register(
    ProviderDescriptor(
        name="bedrock",
        label="Amazon Bedrock",
        api=BEDROCK_CONVERSE,
        # `{region}` is filled from the profile's `region` (providers/wire/bedrock_converse.py).
        default_base_url="https://bedrock-runtime.{region}.amazonaws.com",
        # A Bedrock API key as a bearer token, or SigV4 with an access key pair.
        auth="sigv4",
    )
)
register(
    ProviderDescriptor(
        name="gemini",
        label="Google Gemini",
        api=GEMINI,
        default_base_url="https://generativelanguage.googleapis.com/v1beta",
        # The key as a header: the transport refuses keys in the query string.
        auth="x-goog-api-key",
    )
)
