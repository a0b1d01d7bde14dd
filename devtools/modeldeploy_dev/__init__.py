"""modeldeploy's test and development infrastructure: never imported by the product, never in an image.

See devtools/pyproject.toml and the README section "Test infrastructure (not the product)".
"""
