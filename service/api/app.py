"""``create_app()``: the Litestar application with its routes, DI, auth and problem details."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.config.app import AppConfig
from litestar.openapi import OpenAPIConfig
from litestar.plugins import InitPluginProtocol

from service.api import ops_history, request_telemetry
from service.api.auth import AUTHENTICATOR, Authenticator
from service.api.controllers.admin import AdminController
from service.api.controllers.checkout import CheckoutController
from service.api.controllers.health import HealthController
from service.api.controllers.orders import OrderController
from service.api.controllers.payments import PaymentController
from service.api.controllers.products import ProductController
from service.api.controllers.queue import QueueController
from service.api.controllers.waiting_page import WaitingPageController
from service.api.hooks import make_before_request
from service.api.no_shard import stop_server
from service.api.openapi import document_contract
from service.api.problems import ERROR_HANDLERS, problem_details_plugin
from service.api.providers import WorkerSlot, providers
from service.domain.order_numbers.minter import ShardsExhausted
from service.log_setup import configure_logging
from service.runtime import freeze_startup_heap
from service.settings import Settings, get_settings
from service.startup import BackgroundResources


class FlashsalePlugin(InitPluginProtocol):
    """Wires in one place the routes under ``/api/v1``, one dependency provider per service
    (:mod:`service.api.providers`), the worker's lifespan, the exception handlers, and the
    hooks that authenticate and observe each request (no middleware: docs/ARCHITECTURE.md,
    "Purchase path")."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        settings = self._settings
        slot = WorkerSlot()

        @asynccontextmanager
        async def lifespan(_: Litestar) -> AsyncIterator[None]:
            # Never raises for a store that is away: the worker serves (readiness 503, every
            # other route 503 unavailable) and connects in the background (no crash loop). Every
            # order-number shard leased is not an outage: waiting frees none, so the server stops.
            slot.opening = opening = BackgroundResources(settings, on_no_shard=stop_server)
            try:
                await opening.start()
            except ShardsExhausted:  # stop_server was told (under flashsale serve it did not return)
                slot.opening = None
                raise
            freeze_startup_heap()
            try:
                yield
            finally:
                slot.opening = None
                await opening.close()

        controllers = [
            OrderController,
            CheckoutController,
            ProductController,
            QueueController,
            AdminController,
            HealthController,
            PaymentController,
        ]
        app_config.route_handlers.append(Router("/api/v1", route_handlers=controllers))
        app_config.route_handlers.append(WaitingPageController)  # outside the prefix: a page, not the API
        app_config.lifespan.append(lifespan)
        app_config.dependencies.update(providers(slot))
        app_config.exception_handlers.update(ERROR_HANDLERS)
        telemetry = request_telemetry.install(app_config, settings)  # observes the handlers above
        ops_history.install(app_config, settings)
        auth = settings.auth
        authenticator = Authenticator(
            auth.jwt_secret,
            max_token_length=auth.max_token_bytes,
            leeway_seconds=auth.leeway_seconds,
            audience=auth.audience or None,
            issuer=auth.issuer or None,
        )
        app_config.state[AUTHENTICATOR] = authenticator
        # telemetry, OPTIONS, authentication, 415 for non-JSON bodies, strict bodies
        app_config.before_request = make_before_request(telemetry, authenticator)
        return app_config


def create_app(settings: Settings | None = None) -> Litestar:
    """The purchase API. ``settings`` defaults to the process settings (environment, ``.env``).

    Raises:
        ConfigError: a setting is invalid, or a secret is at its development default outside
            development mode (``flashsale serve`` checks both before starting workers).
    """
    settings = settings or get_settings()
    settings.require_secrets()
    configure_logging(settings.log_level)
    app = Litestar(
        plugins=[problem_details_plugin(), FlashsalePlugin(settings)],
        openapi_config=OpenAPIConfig(title="flashsale", version="0.1.0", path="/schema"),
        logging_config=None,  # service.log_setup: JSON lines for the standard library's loggers too
    )
    document_contract(app)
    return app
