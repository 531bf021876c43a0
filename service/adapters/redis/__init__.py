"""Redis: key names, the Lua scripts and the typed stock store over them."""
