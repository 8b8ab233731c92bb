import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucap.settings")
django_application = get_asgi_application()

# Imported once Django is set up. The instance metadata endpoint is polled by every guest every
# few seconds: it answers its own paths before Django's middleware (gpucap/notices/metadata.py).
from gpucap.notices.metadata import metadata_front  # noqa: E402

application = metadata_front(django_application)
