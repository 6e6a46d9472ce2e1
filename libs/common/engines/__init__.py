"""TODO layout."""
