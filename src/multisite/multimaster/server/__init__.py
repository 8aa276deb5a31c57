"""multimaster.server: see the family's DESIGN.md."""
