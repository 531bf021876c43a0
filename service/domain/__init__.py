"""Use cases and domain rules, one subpackage per subdomain (docs/ARCHITECTURE.md, code map)."""
