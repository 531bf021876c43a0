"""The domain's vocabulary: plain types (enums, dataclasses) that use cases and adapters share.

Ranked below the adapters (tests/unit/test_layers.py): a module here imports only the base layer,
so an adapter may answer in these types without importing a use case.
"""
