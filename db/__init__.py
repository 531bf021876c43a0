"""The authoritative store: SQLAlchemy models, engine, Alembic migrations."""
