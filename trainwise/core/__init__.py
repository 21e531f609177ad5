"""The core: options declared once (option), configs validated once at the edge (config), errors, units,
results with units (results) and the files trainwise writes (files). Imports nothing else of trainwise."""
