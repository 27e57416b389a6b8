"""Pure digest logic: load, group, rank, cap, context, template compile + render."""
