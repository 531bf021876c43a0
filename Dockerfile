FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md requirements.lock ./
COPY service ./service
COPY consumers ./consumers
COPY db ./db
COPY lua ./lua
COPY toolkit ./toolkit
# The exact versions of requirements.lock, then flashsale itself without resolving again.
RUN pip install --no-cache-dir -r requirements.lock && pip install --no-cache-dir --no-deps .
EXPOSE 8000
CMD ["flashsale", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
