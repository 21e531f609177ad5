"""Reports of a study: terminal table, markdown, CSV, JSON and a PNG chart."""
