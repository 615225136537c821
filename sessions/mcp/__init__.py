"""MCP servers the admin registers, who may use them, and the record of every call."""
