FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN DEBUG=0 SECRET_KEY=collectstatic-only python manage.py collectstatic --no-input
ENV DEBUG=0
EXPOSE 8000
CMD ["uvicorn", "gpucap.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
