"""Redis: the client (:mod:`.client`), key names (:mod:`.keys`), the Lua scripts' registry
(:mod:`.scripts`) and the typed stores over them, one module per concept, held together by
:class:`.stores.RedisStores`."""
