"""`infer gate`: pinned anchors, their check, the command."""
