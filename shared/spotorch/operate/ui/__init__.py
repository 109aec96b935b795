"""`spotorch ui`: a local web view of runs and their timelines (server-rendered HTML and SVG)."""
