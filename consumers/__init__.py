"""Workers behind the API: the RabbitMQ order consumer and the stock realignment job."""
