# One image for every role of distributed mode: web (daphne), worker (celery), migrate.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY openworker ./openworker
COPY providers ./providers
COPY sessions ./sessions
RUN pip install .
COPY . .
RUN useradd --create-home --uid 10001 openworker \
    && mkdir -p /app/.state /srv/media \
    && chown -R openworker /app/.state /srv/media
USER openworker

# collectstatic needs settings to load: throwaway values that exist only in this layer.
RUN SECRET_KEY=build-only OPENWORKER_ENCRYPTION_KEYS=YnVpbGQtb25seS1rZXktbm90LXVzZWQtYXQtcnVudG0= \
    DEBUG=0 python manage.py collectstatic --noinput

EXPOSE 8000
# Daphne, its access log without query strings (openworker/web_server.py).
CMD ["python", "-m", "openworker.web_server", "-b", "0.0.0.0", "-p", "8000", "openworker.asgi:application"]
