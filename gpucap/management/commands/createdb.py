"""Create the configured PostgreSQL database if it does not exist yet (used by ``make run``)."""

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql


class Command(BaseCommand):
    help = "Create the database named in DATABASE_URL if it is missing."

    def handle(self, *args, **options) -> None:
        db = settings.DATABASES["default"]
        params = {
            "host": db.get("HOST") or None,
            "port": db.get("PORT") or None,
            "user": db.get("USER") or None,
            "password": db.get("PASSWORD") or None,
            "dbname": "postgres",
            "connect_timeout": 5,
        }
        try:
            with psycopg.connect(autocommit=True, **params) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
                ).fetchone()
                if exists:
                    self.stdout.write(f"database {db['NAME']} exists")
                    return
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
        except psycopg.OperationalError as exc:
            raise CommandError(
                f"cannot reach PostgreSQL at {params['host']}:{params['port']} "
                f"as {params['user']}: {exc}".strip()
            ) from None
        self.stdout.write(self.style.SUCCESS(f"created database {db['NAME']}"))
