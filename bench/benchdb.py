"""What the database benchmarks share: a PostgreSQL database and a Redis database of their own,
created before and dropped after, and the environment Django runs with inside the bench."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit


def redis_url(default_db: int) -> str:
    """The Redis database a bench writes to: ``BENCH_REDIS_URL`` when set (one database for
    every bench: each deletes only its own keys), else the bench's own database ``default_db``
    on the local Redis."""
    return os.environ.get("BENCH_REDIS_URL") or f"redis://127.0.0.1:6379/{default_db}"


def database_name(name: str) -> str:
    """A bench's database name, ``BENCH_DB_SUFFIX`` appended when set: benches run from several
    checkouts against one PostgreSQL server keep to databases of their own."""
    return name + os.environ.get("BENCH_DB_SUFFIX", "")


def bench_env(*, db_name: str, redis_db: int, queue: str) -> dict[str, str]:
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpucap"))
    url = redis_url(redis_db)
    return {
        "DJANGO_SETTINGS_MODULE": "gpucap.settings",
        "DATABASE_URL": urlunsplit(base._replace(path=f"/{db_name}")),
        "DEBUG": "0",  # as deployed: no debug cursor, no template debug information
        "SECRET_KEY": "bench-only-secret-key",
        "ALLOWED_HOSTS": "testserver",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on loopback
        "REDIS_URL": url,
        "CELERY_BROKER_URL": url,
        "METADATA_REDIS_URL": url,
        "INFERENCE_REDIS_URL": url,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "LOG_LEVEL": "WARNING",
    }


def _admin_url(database_url: str) -> str:
    return urlunsplit(urlsplit(database_url)._replace(path="/postgres"))


def _name(database_url: str) -> str:
    return urlsplit(database_url).path.lstrip("/")


def database_create(database_url: str) -> None:
    import psycopg
    from psycopg import sql

    name = sql.Identifier(_name(database_url))
    with psycopg.connect(_admin_url(database_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))


def database_drop(database_url: str) -> None:
    import psycopg
    from psycopg import sql

    name = sql.Identifier(_name(database_url))
    with psycopg.connect(_admin_url(database_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def redis_forget(redis_url: str, queue: str) -> None:
    """Delete what a bench leaves in its Redis database: gpucap's keys (cache, metadata,
    inference, all under ``gpucap:``), its own Celery queue and the bindings a worker made for
    that queue (kombu's ``_kombu.binding.<queue>`` keys). Never the whole database: other
    programs may share it."""
    import redis

    from gpucap.redis_clients import keys_delete

    client = redis.Redis.from_url(redis_url)
    keys_delete(client, "gpucap:*")
    client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")


def vacuum_analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def postgres_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return cursor.fetchone()[0].split()[0]
