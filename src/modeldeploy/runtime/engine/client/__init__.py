"""The engine clients: how the HTTP server drives the engine, and the engine core process.

`EngineClient` (`base`) and `make_client` (`factory`), which picks a layout: `AsyncEngine`
(`async_engine`: the step loop on a thread of this process) or `EngineCoreClient` (`core_client`:
the step loop in the engine core process, `engine_core`, over the pipe messages of `messages`).
`stream` holds each request's outputs on the event loop. May import `llm_engine` and everything
below it; nothing else in the engine imports this package.
"""
