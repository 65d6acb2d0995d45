"""What runs in a user's process: dispatch (memo -> cache -> shipped -> fallback), the problem recorder, patching."""
