"""The workspace tools, the argument checks every tool shares, and the tool registry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from openworker.runtime.agent.tools import (
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    WorkspacePathError,
    default_registry,
    workspace_path,
)
from openworker.runtime.agent.tools import workspace as ws
from providers.outbound import OutboundPolicy


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext("s1", tmp_path / "sessions" / "s1", OutboundPolicy())


def call(name: str, ctx: ToolContext, **args: Any) -> ToolResult:
    tool = default_registry().get(name)
    assert tool is not None
    return tool.run(args, ctx)


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.content
    return result.content


def err(result: ToolResult) -> str:
    assert result.is_error, result.content
    return result.content


# --- paths ------------------------------------------------------------------------------


def test_the_workspace_root_is_created_on_demand(ctx: ToolContext) -> None:
    assert not ctx.workspace_root.exists()
    assert ok(call("list_files", ctx)) == "The workspace is empty."
    assert ctx.workspace_root.is_dir()


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../escape.txt", "a/../../escape.txt", "a/..", "nul\x00byte", "C:\\x.txt"],
)
def test_unsafe_paths_are_refused_and_nothing_is_written(ctx: ToolContext, path: str) -> None:
    message = err(call("write_file", ctx, path=path, content="x"))
    assert message.startswith("refused: ")
    outside = ctx.workspace_root.parent
    assert not (outside / "escape.txt").exists()
    assert [p.name for p in outside.iterdir()] == ["s1"]


def test_a_symlink_does_not_lead_reads_or_writes_out_of_the_root(
    ctx: ToolContext, tmp_path: Path
) -> None:
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "key.txt").write_text("top secret")
    ctx.workspace_root.mkdir(parents=True)
    (ctx.workspace_root / "link").symlink_to(secret_dir)
    (ctx.workspace_root / "file-link.txt").symlink_to(secret_dir / "key.txt")

    assert "outside the workspace" in err(call("read_file", ctx, path="link/key.txt"))
    assert "outside the workspace" in err(call("read_file", ctx, path="file-link.txt"))
    assert "outside the workspace" in err(call("write_file", ctx, path="link/new", content="x"))
    assert "refused" in err(
        call("edit_file", ctx, path="file-link.txt", old_string="top", new_string="no")
    )
    assert sorted(p.name for p in secret_dir.iterdir()) == ["key.txt"]
    assert (secret_dir / "key.txt").read_text() == "top secret"
    listing = ok(call("list_files", ctx))
    assert "link  (symlink, not followed)" in listing
    assert "key.txt" not in listing


def test_a_symlink_inside_the_root_is_allowed(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="docs/real.txt", content="hello\n"))
    (ctx.workspace_root / "alias.txt").symlink_to(ctx.workspace_root / "docs" / "real.txt")
    assert ok(call("read_file", ctx, path="alias.txt")) == "hello\n"


def test_workspace_path_resolves_inside_the_root_for_the_web_layer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert workspace_path(root, "") == root.resolve()
    assert workspace_path(root, "a/b.txt") == root.resolve() / "a" / "b.txt"
    with pytest.raises(WorkspacePathError):
        workspace_path(root, "../root2/x")
    with pytest.raises(WorkspacePathError):
        workspace_path(root, "/tmp/x")


# --- list / read / write / edit -----------------------------------------------------------


def test_list_files_is_recursive_with_sizes(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="notes.md", content="abc"))
    ok(call("write_file", ctx, path="src/app/main.py", content="print(1)\n"))
    listing = ok(call("list_files", ctx))
    assert listing.splitlines() == [
        "notes.md  3 bytes",
        "src/",
        "src/app/",
        "src/app/main.py  9 bytes",
        "2 files, 12 bytes",
    ]
    assert ok(call("list_files", ctx, path="src")).splitlines()[0] == "src/app/"


def test_list_files_stops_at_the_entry_cap(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws, "LIST_MAX_ENTRIES", 2)
    for name in "abcd":
        ok(call("write_file", ctx, path=f"{name}.txt", content="x"))
    lines = ok(call("list_files", ctx)).splitlines()
    assert lines == [
        "a.txt  1 bytes",
        "b.txt  1 bytes",
        "[2 more entries not shown: list a subfolder]",
        "4 files, 4 bytes",
    ]


def test_write_then_read_round_trips_text_exactly(ctx: ToolContext) -> None:
    content = "first\r\nsecond — ünïcode\nno newline at end"
    assert ok(call("write_file", ctx, path="a/b.txt", content=content)).startswith(
        "Created a/b.txt"
    )
    assert ok(call("read_file", ctx, path="a/b.txt")) == content
    assert ok(call("write_file", ctx, path="a/b.txt", content="v2")).startswith("Replaced")
    assert ok(call("read_file", ctx, path="a/b.txt")) == "v2"


def test_read_file_pages_with_offset_and_limit(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="n.txt", content="".join(f"line {i}\n" for i in range(1, 11))))
    page = ok(call("read_file", ctx, path="n.txt", offset=3, limit=2))
    assert page == "line 3\nline 4\n[lines 3-4 shown; more follow: read with offset=5]"
    assert ok(call("read_file", ctx, path="n.txt", offset=9)) == "line 9\nline 10\n"


def test_read_file_past_the_end_is_an_error(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="n.txt", content="one\ntwo\n"))
    assert "past the end" in err(call("read_file", ctx, path="n.txt", offset=5))


def test_read_file_refuses_binary_and_non_utf8(ctx: ToolContext) -> None:
    ctx.workspace_root.mkdir(parents=True)
    (ctx.workspace_root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (ctx.workspace_root / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert "binary" in err(call("read_file", ctx, path="img.png"))
    assert "not UTF-8" in err(call("read_file", ctx, path="latin.txt"))


def test_read_file_caps_output_at_200_kb_with_a_note(ctx: ToolContext) -> None:
    line = "x" * 1023 + "\n"
    ok(call("write_file", ctx, path="big.txt", content=line * 300))
    content = ok(call("read_file", ctx, path="big.txt"))
    body, note = content.rsplit("\n[", 1)
    assert len(body.encode()) <= ws.READ_MAX_BYTES
    assert note.startswith("truncated at 200 KB: lines 1-201 shown")
    assert note.endswith("continue with offset=201]")


def test_read_file_of_a_missing_file_or_a_folder_says_so(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="d/x.txt", content="x"))
    assert "no such file" in err(call("read_file", ctx, path="nope.txt"))
    assert "is a folder" in err(call("read_file", ctx, path="d"))


def test_write_file_refuses_content_over_the_per_file_cap(ctx: ToolContext) -> None:
    too_big = "x" * (ws.WRITE_MAX_FILE_BYTES + 1)
    assert "limit per file" in err(call("write_file", ctx, path="big.txt", content=too_big))
    assert not (ctx.workspace_root / "big.txt").exists()


def test_write_file_refuses_to_exceed_the_workspace_quota(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws, "WORKSPACE_MAX_BYTES", 100)
    ok(call("write_file", ctx, path="a.txt", content="x" * 60))
    assert "over its 100-byte limit" in err(call("write_file", ctx, path="b.txt", content="y" * 50))
    # Overwriting counts only the difference: 60 bytes replaced by 90 still fits.
    ok(call("write_file", ctx, path="a.txt", content="z" * 90))


def test_edit_file_replaces_a_unique_match(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="m.py", content="def f():\n    return 1\n"))
    done = ok(call("edit_file", ctx, path="m.py", old_string="return 1", new_string="return 2"))
    assert done == "Replaced 1 occurrence in m.py"
    assert (ctx.workspace_root / "m.py").read_text() == "def f():\n    return 2\n"


def test_edit_file_refuses_an_ambiguous_match_unless_replace_all(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="m.txt", content="a a a"))
    ambiguous = call("edit_file", ctx, path="m.txt", old_string="a", new_string="b")
    assert "occurs 3 times" in err(ambiguous)
    assert (ctx.workspace_root / "m.txt").read_text() == "a a a"
    done = ok(
        call("edit_file", ctx, path="m.txt", old_string="a", new_string="b", replace_all=True)
    )
    assert done == "Replaced 3 occurrences in m.txt"
    assert (ctx.workspace_root / "m.txt").read_text() == "b b b"


def test_edit_file_reports_a_missing_match_with_a_line_ending_hint(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="w.txt", content="one\r\ntwo\r\n"))
    message = err(call("edit_file", ctx, path="w.txt", old_string="one\ntwo", new_string="x"))
    assert message == "old_string was not found in w.txt (the file uses CRLF line endings)"


def test_edit_file_respects_the_per_file_cap(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws, "WRITE_MAX_FILE_BYTES", 10)
    ok(call("write_file", ctx, path="s.txt", content="abc"))
    assert "limit per file" in err(
        call("edit_file", ctx, path="s.txt", old_string="b", new_string="b" * 20)
    )
    assert (ctx.workspace_root / "s.txt").read_text() == "abc"


def test_no_temporary_files_are_left_behind(ctx: ToolContext) -> None:
    ok(call("write_file", ctx, path="t.txt", content="1"))
    ok(call("edit_file", ctx, path="t.txt", old_string="1", new_string="2"))
    assert os.listdir(ctx.workspace_root) == ["t.txt"]


# --- arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "'path' is a required property"),
        ({"path": "a", "offset": "3"}, "at arguments.offset: '3' is not of type 'integer'"),
        ({"path": "a", "offset": 0}, "at arguments.offset: 0 is less than the minimum of 1"),
        ({"path": "a", "limit": True}, "True is not of type 'integer'"),
        ({"path": "a", "mode": "r"}, "Additional properties are not allowed ('mode' was"),
        (["a"], "['a'] is not of type 'object'"),
        (None, "None is not of type 'object'"),
    ],
)
def test_bad_arguments_become_an_error_result_the_model_can_read(
    ctx: ToolContext, args: Any, expected: str
) -> None:
    tool = default_registry().get("read_file")
    assert tool is not None
    message = err(tool.run(args, ctx))
    assert message.startswith("Invalid arguments for read_file")
    assert expected in message
    assert message.endswith("Expected: path (string, required), offset (integer), limit (integer).")


def test_a_tool_with_a_broken_schema_fails_at_definition() -> None:
    from jsonschema.exceptions import SchemaError

    with pytest.raises(SchemaError):

        class Broken(Tool):
            name = "broken"
            description = "x"
            parameters = {"type": "object", "properties": {"a": {"type": "nonsense"}}}

            def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
                return ""


# --- registry ---------------------------------------------------------------------------


class Echo(Tool):
    name = "echo"
    description = "Echo the text back."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    default_policy = "allow"

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return args["text"]


def test_definitions_are_sorted_and_byte_stable_whatever_the_registration_order() -> None:
    forward = default_registry()
    forward.register(Echo())
    backward = ToolRegistry([Echo(), *reversed(list(default_registry()))])
    names = [d["name"] for d in forward.definitions()]
    assert names == sorted(names)
    assert names == ["echo", "edit_file", "fetch_url", "list_files", "read_file", "write_file"]
    assert json.dumps(forward.definitions()) == json.dumps(backward.definitions())
    assert set(forward.definitions()[0]) == {"name", "description", "parameters"}


def test_definitions_are_copies_the_caller_may_edit() -> None:
    registry = ToolRegistry([Echo()])
    registry.definitions()[0]["parameters"]["properties"]["text"]["cache_control"] = "x"
    assert "cache_control" not in Echo.parameters["properties"]["text"]


def test_registering_a_name_twice_is_an_error() -> None:
    registry = ToolRegistry([Echo()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Echo())


def test_policy_defaults_and_admin_overrides() -> None:
    registry = default_registry()
    assert registry.policy_for("read_file") == "allow"
    assert registry.policy_for("write_file") == "allow"
    assert registry.policy_for("fetch_url") == "ask"
    assert registry.policy_for("fetch_url", {"fetch_url": "allow"}) == "allow"
    assert registry.policy_for("write_file", {"write_file": " Deny "}) == "deny"
    assert registry.policy_for("read_file", {"fetch_url": "deny"}) == "allow"


def test_unknown_tools_and_invalid_overrides_are_denied() -> None:
    registry = default_registry()
    assert registry.policy_for("rm_rf") == "deny"
    assert registry.policy_for("rm_rf", {"rm_rf": "allow"}) == "deny"
    assert registry.policy_for("read_file", {"read_file": "alow"}) == "deny"
    assert registry.get("rm_rf") is None


def test_a_tool_runs_with_validated_arguments(ctx: ToolContext) -> None:
    assert ToolRegistry([Echo()]).get("echo").run({"text": "hi"}, ctx) == ToolResult("hi")  # type: ignore[union-attr]
