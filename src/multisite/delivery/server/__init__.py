"""delivery.server: see the family's DESIGN.md."""
