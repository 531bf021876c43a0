FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY consumers ./consumers
COPY db ./db
COPY lua ./lua
RUN pip install --no-cache-dir .
EXPOSE 8000
CMD ["flashsale", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
