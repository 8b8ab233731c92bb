FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
# libvirt-python builds against libvirt's headers; keep only the runtime library afterwards.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config libvirt-dev \
 && pip install --no-cache-dir -r requirements.txt \
 && apt-mark manual $(dpkg-query -W -f '${Package}\n' 'libvirt0*') \
 && apt-get purge -y --auto-remove gcc libc6-dev pkg-config libvirt-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# PYTHONDONTWRITEBYTECODE keeps Python from caching bytecode at run time, so compile it once
# here: otherwise every process (uvicorn, the worker, each `python -m gpucap.arbiter` run)
# compiles the app's source again as it starts.
RUN python -m compileall -q gpucap
RUN DEBUG=0 SECRET_KEY=collectstatic-only python manage.py collectstatic --no-input
ENV DEBUG=0
EXPOSE 8000
CMD ["uvicorn", "gpucap.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
