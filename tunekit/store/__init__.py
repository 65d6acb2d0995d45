"""The persistent cache: keys, entries, the sqlite store, tuning databases (export/import/merge), forgetting."""
