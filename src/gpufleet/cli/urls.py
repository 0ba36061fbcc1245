"""`--url` as a user types it: a server's base URL, or an endpoint URL taken apart."""

from __future__ import annotations

import click

from gpufleet.errors import UserError

# An endpoint path in --url -> the --endpoint it means.
_ENDPOINT_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


def base_url(url: str, endpoint: str, endpoint_given: bool) -> tuple[str, str]:
    """--url may name an endpoint (…/v1/chat/completions): use its server and say so."""
    from urllib.parse import urlsplit

    if not url.startswith(("http://", "https://")):
        return url, endpoint  # BenchConfig.validate says what is wrong
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix, implied in _ENDPOINT_PATHS.items():
        if path.endswith(suffix):
            if endpoint_given and endpoint != implied:
                raise UserError(
                    f"{url} is the {implied} endpoint but --endpoint is {endpoint}",
                    field="--url",
                    fix="give the server's base URL (e.g. http://127.0.0.1:8000) with "
                    "--endpoint, or drop --endpoint",
                )
            base = url[: url.rstrip("/").rindex(suffix)]
            click.echo(
                f"note: --url names an endpoint; benchmarking {base} with --endpoint {implied}",
                err=True,
            )
            return base, implied
    if path not in ("", "/v1"):
        raise UserError(
            f"{url} is not a server's base URL",
            field="--url",
            fix=f"give the server root, e.g. {parts.scheme}://{parts.netloc} (a trailing /v1 "
            "is fine); pick the API with --endpoint completions|chat",
        )
    return url, endpoint
