"""Pure routing decisions: filters, scorers and pickers over endpoint snapshots."""
