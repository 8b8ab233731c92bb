"""gpucap: a GPU capacity manager for GPU cloud operators.

Kept free of imports on purpose: ``python -m gpucap.arbiter`` must start fast and without
Django. The Celery app is loaded by ``gpucap.apps.GpucapConfig.ready``.
"""
