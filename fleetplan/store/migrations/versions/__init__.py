"""One module per schema revision (Alembic)."""
