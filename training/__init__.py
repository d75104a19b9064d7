"""longpack's trainer over packed shards (issue 5)."""
