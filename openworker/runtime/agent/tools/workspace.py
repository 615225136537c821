"""The session's workspace: a private folder the agent lists, reads, writes and edits.

Every path the model gives is relative to the workspace root and is checked by
`workspace_path`: no absolute paths, no `..`, no NUL bytes, and after resolving symlinks the
target must still be inside the root, so a link cannot lead a read or a write out of it.
The web layer uses the same function for downloads. Files are UTF-8 text: the tools refuse
binary content rather than hand the model mojibake.
"""

from __future__ import annotations

import io
import os
import tempfile
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from .base import Policy, Tool, ToolContext, ToolError, ToolResult

# What one read returns: ~50k tokens, enough to work on a large source file without one
# call eating the context window. Larger files are read in pages with offset/limit.
READ_MAX_BYTES = 200 * 1024
# Per file and per workspace: the workspace is scratch space for text the agent produces,
# not storage; the caps keep one runaway loop from filling the server's disk.
WRITE_MAX_FILE_BYTES = 1024 * 1024
WORKSPACE_MAX_BYTES = 50 * 1024 * 1024
# A listing is for orientation; past this many entries the model should list a subfolder.
LIST_MAX_ENTRIES = 1000
# The same heuristic as git and grep: a NUL byte in the first block means binary.
BINARY_SNIFF_BYTES = 8192


class WorkspacePathError(ValueError):
    """A path the workspace refuses; the message says why and is safe to show."""


def workspace_path(root: Path, relative: str) -> Path:
    """The resolved path of `relative` inside `root`, or `WorkspacePathError`.

    "" and "." mean the root itself. The result has its symlinks resolved, so using it
    does not follow a link again; the file need not exist yet.
    """
    if not isinstance(relative, str):
        raise WorkspacePathError("the path must be a string")
    if "\x00" in relative:
        raise WorkspacePathError("the path contains a NUL byte")
    base = root.resolve()
    if relative in ("", "."):
        return base
    posix, windows = PurePosixPath(relative), PureWindowsPath(relative)
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise WorkspacePathError(f"{relative!r} is absolute; give a path inside the workspace")
    if ".." in posix.parts or ".." in windows.parts:
        raise WorkspacePathError(f"{relative!r} contains '..'; paths may not leave the workspace")
    target = (base / posix).resolve()
    if not target.is_relative_to(base):
        raise WorkspacePathError(f"{relative!r} leads outside the workspace through a symlink")
    return target


def workspace_usage(root: Path) -> int:
    """Bytes held by the regular files under `root` (symlinks are not followed)."""
    return sum(size for _, size in _walk(root, root) if size is not None)


def _walk(folder: Path, base: Path) -> Iterator[tuple[str, int | None]]:
    """(path relative to base, size) depth-first in name order; size None for a folder,
    -1 for a symlink (listed, never followed)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        rel = Path(entry.path).relative_to(base).as_posix()
        if entry.is_symlink():
            yield rel, -1
        elif entry.is_dir(follow_symlinks=False):
            yield rel + "/", None
            yield from _walk(Path(entry.path), base)
        elif entry.is_file(follow_symlinks=False):
            yield rel, entry.stat(follow_symlinks=False).st_size


def _atomic_write(target: Path, data: bytes) -> None:
    """Replace `target` in one step: a failed write never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _decode_text(data: bytes, rel: str) -> str:
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        raise ToolError(f"{rel} is a binary file; only UTF-8 text files can be read or edited")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{rel} is not UTF-8 text; only text files can be read or edited") from None


class WorkspaceTool(Tool):
    """Shared plumbing: the root is created on demand, paths are checked, OS errors become
    messages naming the relative path (the server's own directory layout is not shown)."""

    default_policy: Policy = "allow"

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult | str:
        ctx.workspace_root.mkdir(parents=True, exist_ok=True)
        base = ctx.workspace_root.resolve()
        shown = args.get("path") or "."
        try:
            return self.apply(base, args)
        except WorkspacePathError as exc:
            raise ToolError(f"refused: {exc}") from None
        except OSError as exc:
            raise ToolError(f"{self.name} failed on {shown!r}: {exc.strerror or exc}") from None

    @abstractmethod
    def apply(self, base: Path, args: dict[str, Any]) -> ToolResult | str: ...

    @staticmethod
    def _rel(base: Path, target: Path) -> str:
        return target.relative_to(base).as_posix()

    @staticmethod
    def _check_room(base: Path, target: Path, new_size: int) -> None:
        if new_size > WRITE_MAX_FILE_BYTES:
            raise ToolError(
                f"{new_size:,} bytes is over the {WRITE_MAX_FILE_BYTES:,}-byte limit per file"
            )
        existing = target.stat().st_size if target.is_file() else 0
        after = workspace_usage(base) - existing + new_size
        if after > WORKSPACE_MAX_BYTES:
            raise ToolError(
                f"the workspace would hold {after:,} bytes, over its "
                f"{WORKSPACE_MAX_BYTES:,}-byte limit; delete or shrink files first"
            )


class ListFilesTool(WorkspaceTool):
    name = "list_files"
    description = (
        "List the files in the session workspace, recursively, with their sizes in bytes. "
        "Paths in the listing can be passed to read_file, write_file and edit_file."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Folder to list, relative to the workspace root (default: root).",
            }
        },
        "additionalProperties": False,
    }

    def apply(self, base: Path, args: dict[str, Any]) -> str:
        target = workspace_path(base, args.get("path", ""))
        if target.is_file():
            return f"{self._rel(base, target)}  {target.stat().st_size:,} bytes"
        if not target.is_dir():
            raise ToolError(f"no such folder in the workspace: {args.get('path')!r}")
        lines: list[str] = []
        files = total = skipped = 0
        for rel, size in _walk(target, base):
            if size is not None and size >= 0:
                files += 1
                total += size
            if len(lines) == LIST_MAX_ENTRIES:
                skipped += 1
            elif size is None:
                lines.append(rel)
            elif size < 0:
                lines.append(f"{rel}  (symlink, not followed)")
            else:
                lines.append(f"{rel}  {size:,} bytes")
        if not lines:
            return "The workspace is empty." if target == base else "The folder is empty."
        if skipped:
            lines.append(f"[{skipped} more entries not shown: list a subfolder]")
        lines.append(f"{files} files, {total:,} bytes")
        return "\n".join(lines)


class ReadFileTool(WorkspaceTool):
    name = "read_file"
    description = (
        "Read a UTF-8 text file from the session workspace. Returns at most 200 KB per call; "
        "use offset and limit (in lines) to read a long file in parts."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "offset": {
                "type": "integer",
                "minimum": 1,
                "description": "First line to return, counting from 1 (default 1).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "Maximum number of lines to return (default: all).",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def apply(self, base: Path, args: dict[str, Any]) -> str:
        target = workspace_path(base, args["path"])
        rel = self._rel(base, target) if target != base else "."
        if target.is_dir():
            raise ToolError(f"{rel} is a folder; use list_files to see what it holds")
        if not target.is_file():
            raise ToolError(f"no such file in the workspace: {args['path']!r}")
        offset: int = args.get("offset", 1)
        limit: int | None = args.get("limit")
        with target.open("rb") as raw:
            _decode_text(raw.read(BINARY_SNIFF_BYTES), rel)
            raw.seek(0)
            text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            try:
                return self._page(text, rel, offset, limit)
            except UnicodeDecodeError:
                raise ToolError(f"{rel} is not UTF-8 text; only text files can be read") from None

    @staticmethod
    def _page(lines: io.TextIOWrapper, rel: str, offset: int, limit: int | None) -> str:
        out: list[str] = []
        used = seen = 0
        last = offset - 1
        note = ""
        for number, line in enumerate(lines, start=1):
            seen = number
            if number < offset:
                continue
            if limit is not None and len(out) == limit:
                note = f"[lines {offset}-{last} shown; more follow: read with offset={last + 1}]"
                break
            size = len(line.encode("utf-8"))
            if used + size > READ_MAX_BYTES:
                room = READ_MAX_BYTES - used
                out.append(line.encode("utf-8")[:room].decode("utf-8", errors="ignore"))
                # Resume on the cut line, unless it alone is over the cap: then move past it.
                resume = number if number > offset else number + 1
                note = (
                    f"[truncated at {READ_MAX_BYTES // 1024} KB: lines {offset}-{number} shown, "
                    f"line {number} cut short; continue with offset={resume}]"
                )
                break
            out.append(line)
            used += size
            last = number
        if offset > 1 and seen < offset:
            raise ToolError(f"offset {offset} is past the end of {rel} ({seen} lines)")
        body = "".join(out)
        if not body and not note:
            return f"[{rel} is empty]"
        if note:
            return body + ("" if body.endswith("\n") else "\n") + note
        return body


class WriteFileTool(WorkspaceTool):
    name = "write_file"
    description = (
        "Create or overwrite a UTF-8 text file in the session workspace (folders are created "
        "as needed). Limits: 1 MB per file, 50 MB per workspace."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def apply(self, base: Path, args: dict[str, Any]) -> str:
        target = workspace_path(base, args["path"])
        if target == base or target.is_dir():
            raise ToolError(f"{args['path']!r} is a folder, not a file")
        data = args["content"].encode("utf-8")
        self._check_room(base, target, len(data))
        existed = target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, data)
        verb = "Replaced" if existed else "Created"
        return f"{verb} {self._rel(base, target)} ({len(data):,} bytes)"


class EditFileTool(WorkspaceTool):
    name = "edit_file"
    description = (
        "Replace text in a workspace file. old_string must match the file exactly (including "
        "whitespace and indentation) and only once, unless replace_all is true."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "old_string": {"type": "string", "minLength": 1, "description": "Exact text."},
            "new_string": {"type": "string", "description": "The replacement text."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence instead of exactly one (default false).",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    def apply(self, base: Path, args: dict[str, Any]) -> str:
        target = workspace_path(base, args["path"])
        rel = self._rel(base, target) if target != base else "."
        if not target.is_file():
            raise ToolError(f"no such file in the workspace: {args['path']!r}")
        old, new = args["old_string"], args["new_string"]
        if old == new:
            raise ToolError("old_string and new_string are the same; nothing to change")
        text = _decode_text(target.read_bytes(), rel)
        count = text.count(old)
        if count == 0:
            hint = ""
            if "\r\n" in text and "\n" in old and "\r\n" not in old:
                hint = " (the file uses CRLF line endings)"
            raise ToolError(f"old_string was not found in {rel}{hint}")
        replace_all = bool(args.get("replace_all", False))
        if count > 1 and not replace_all:
            raise ToolError(
                f"old_string occurs {count} times in {rel}; include more surrounding text to "
                "make it unique, or set replace_all to true"
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        data = updated.encode("utf-8")
        self._check_room(base, target, len(data))
        _atomic_write(target, data)
        done = count if replace_all else 1
        return f"Replaced {done} occurrence{'s' if done != 1 else ''} in {rel}"


WORKSPACE_TOOLS: tuple[type[WorkspaceTool], ...] = (
    ListFilesTool,
    ReadFileTool,
    WriteFileTool,
    EditFileTool,
)
