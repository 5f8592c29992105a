"""Alembic migrations, shipped inside the package so that an installed wheel can run them."""
