"""Shipped tuning databases: JSON files, one per device, read-only at run time (tunekit.store.database)."""
