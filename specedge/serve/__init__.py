"""`specedge serve`: an OpenAI-compatible local HTTP server over one Generator.

Modules, one concern each: `protocol` (request parsing and validation into dataclasses, the
OpenAI error object), `responses` (OpenAI-shaped responses, stream chunks and specedge's stats),
`logprobs` (tokens' log-probabilities in OpenAI's shapes), `metrics` (the counters and histograms
of GET /metrics, in Prometheus' text format), `structured` (response formats and required tool
calls as grammars), `worker` (the single generation thread and its bounded arrival-order queue),
`guard` (which hosts, origins and bodies may drive the server), `connections` (deadlines and
bounds on connections that send no request), `app` (the ASGI application), `command` (the CLI
subcommand). Only `app`, `guard`, `connections` and `command` import the server stack (starlette,
uvicorn, h11: the `serve` extra); nothing in the runtime imports this package.
"""
