"""verl glue: registration into verl's registries, typed configs, startup validation, trainer hooks."""
