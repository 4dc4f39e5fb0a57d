"""django-celery-results for the result backend bench: the least Django it needs.

Django is configured in code (no settings module): the one app
``django_celery_results`` on the bench's PostgreSQL database. Its tables are
made once by ``python -m bench.result_backend.dcr URL``, Django's ``migrate``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sqlalchemy.engine import make_url


def configure_django(database_url: str) -> None:
    """Django set up on ``database_url`` (a SQLAlchemy URL), once per process."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    url = make_url(database_url)
    settings.configure(
        INSTALLED_APPS=["django_celery_results"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.database,
                "USER": url.username or "",
                "PASSWORD": url.password or "",
                "HOST": url.host or "",
                "PORT": str(url.port or ""),
            }
        },
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.result_backend.dcr DATABASE_URL")
    configure_django(args[0])
    from django.core.management import call_command

    call_command("migrate", "django_celery_results", verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
